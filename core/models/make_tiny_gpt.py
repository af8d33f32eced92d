"""The small GPT-2-format checkpoint the project ships, re-created from the text it ships.

    python -m core.models.make_tiny_gpt            # writes core/models/tiny_gpt/ (600 steps: 7 min on a busy 2-core machine)
    python -m core.models.make_tiny_gpt --out DIR --steps 600 --seed 0

1. A byte-level BPE tokenizer (GPT-2's kind, from the ``tokenizers`` library) is trained on
   ``core/models/corpus.txt``, with a small vocabulary.
2. A decoder-only transformer with GPT-2's architecture (pre-norm, GELU, learned positions, tied
   unembedding, final LayerNorm) is trained on that text to predict the next token, with Adam.
3. :func:`core.models.pretrained.save` writes ``config.json``, ``model.safetensors`` and
   ``tokenizer.json``: a folder that both :func:`pretrained.load` and ``transformers`` read.

The gradient is the one transformer's hand-written backward pass
(:func:`core.models.transformer_backward.loss_and_grads`), held to finite differences and to
PyTorch's autograd by the tests.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from core.models import decoder, loop, optim, pretrained
from core.models import transformer as tr
from core.models import transformer_backward

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.txt")
OUT = os.path.join(HERE, "tiny_gpt")
END = "<|endoftext|>"
CONFIG = dict(n_ctx=64, d_model=64, n_heads=4, d_ff=256, n_layers=2, norm="pre", activation="gelu_tanh",
              positional="learned", tied_unembed=True, final_ln=True, bias=True, causal=True)


def train_tokenizer(text: str, vocab_size: int = 512):
    """A byte-level BPE tokenizer (as GPT-2's) trained on ``text``; ``<|endoftext|>`` is its one special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    return tok


# the loss and its gradient: the one transformer's readable backward pass, for GPT-2's settings
loss_and_grads = transformer_backward.loss_and_grads


def train(params: dict, cfg: tr.TransformerConfig, ids: np.ndarray, *, steps: int, batch_size: int = 16,
          lr: float = 3e-3, seed: int = 0, log=print) -> list[float]:
    """Adam on random windows of ``ids`` (the whole text as one stream of tokens), through the
    training loop every model shares (:mod:`core.models.loop`); ``params`` in place."""
    names = list(tr.param_shapes(cfg))
    flat, views = decoder.pack({n: params[n] for n in names})
    grads = np.empty_like(flat)
    rng = np.random.default_rng(seed)
    T = cfg.n_ctx

    def windows(step):                      # a batch of windows: the tokens, and the tokens after them
        starts = rng.integers(0, len(ids) - T - 1, size=batch_size)
        window = np.stack([ids[s:s + T + 1] for s in starts])                     # (B, T+1)
        return window[:, :-1], window[:, 1:]

    def gradient(x, y, out):
        loss, g = loss_and_grads(views, cfg, x, y)
        out[:] = np.concatenate([g[n].reshape(-1) for n in names])
        return loss

    def rate(step):                         # a 50-step warm-up, then a half cosine down to 55 %
        return lr * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(math.pi * step / max(steps - 1, 1)))

    update = loop.gradient_update(gradient, flat, grads, optim.Adam(flat.size, flat.dtype, lr))
    losses = []
    for s in loop.steps(update, windows, stop=steps, rate=rate):
        losses.append(s.loss)
        if log and (s.step % 100 == 0 or s.step == steps - 1):
            log(f"step {s.step:5d}  loss {s.loss:.3f}")
    for n in names:
        params[n] = np.array(views[n])
    return losses


def make(out: str = OUT, *, steps: int = 600, seed: int = 0, log=print) -> dict:
    """Train the tokenizer and the model on corpus.txt and save the checkpoint in ``out``."""
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    tok = train_tokenizer(text)
    ids = np.asarray(tok.encode(text).ids, dtype=np.int64)
    cfg = tr.TransformerConfig(vocab_size=tok.get_vocab_size(), **CONFIG)
    params = tr.init_params(cfg, seed=seed, dtype=np.float32)
    params = {n: (0.02 / 0.1 * v if n == "pos" else v) for n, v in params.items()}
    start = time.perf_counter()
    losses = train(params, cfg, ids, steps=steps, seed=seed, log=log)
    if log:
        log(f"{len(ids)} tokens, vocabulary {cfg.vocab_size}, {tr.param_count(cfg):,} parameters, "
            f"{steps} steps in {time.perf_counter() - start:.0f} s; final loss {np.mean(losses[-50:]):.3f}")
    pretrained.save(params, cfg, out, tokenizer=tok)
    return {"config": cfg, "losses": losses}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make(args.out, steps=args.steps, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
