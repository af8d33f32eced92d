"""The small GPT-2-format checkpoint the project ships, re-created from the text it ships.

    python -m core.training.make_tiny_gpt            # writes core/model/tiny_gpt/
    python -m core.training.make_tiny_gpt --out DIR --steps 6000 --seed 0

1. A byte-level BPE tokenizer (GPT-2's kind, from the ``tokenizers`` library) is trained on
   ``core/training/corpus.txt``, with a small vocabulary. The corpus was written for this project
   (short sentences about attention and transformers) and ships under the project's own license.
2. A decoder-only transformer with GPT-2's architecture (pre-norm, GELU, tied unembedding, final
   LayerNorm; learned positions, which start from the sinusoidal code) is
   trained with Adam to predict the next token, on windows of three kinds (1 : 1 : 3), each
   starting with ``<|endoftext|>``:

   * a stretch of the text as it is;
   * a passage of the text, then the text again from the same place: the second copy can be
     predicted by looking up what followed each token the first time, which is what an
     induction head does (and it needs a previous-token head in the layer before);
   * 4 to 32 random token ids, repeated until the window is full: copying for every id of the vocabulary, also
     the bytes the text never uses (this is the head detector's kind of sequence). Without
     these, the model learns the short text by heart from the bag of tokens before each position
     and grows neither head; with them, both appear suddenly after about 2000 steps.
3. :func:`core.model.pretrained.save` writes ``config.json``, ``model.safetensors`` and
   ``tokenizer.json``: a folder that both :func:`pretrained.load` and ``transformers`` read.

The gradient is the one transformer's hand-written backward pass
(:func:`core.model.transformer_backward.loss_and_grads`), held to finite differences and to
PyTorch's autograd by the tests.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from core import positional
from core.model import optim, pretrained
from core.training import loop
from core.model import config as C
from core.model import transformer_backward
from core.model.params import pack

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.txt")
OUT = os.path.join(os.path.dirname(HERE), "model", "tiny_gpt")
END = "<|endoftext|>"
VOCAB_SIZE = 512
CONFIG = dict(n_ctx=64, d_model=64, n_heads=4, d_ff=256, n_layers=2, norm_placement="pre", activation="gelu_tanh",
              positional="learned", tied_unembed=True, final_ln=True, bias=True, causal=True)
SHARES = (0.2, 0.2, 0.6)            # text as it is, text repeated, random ids repeated


def train_tokenizer(text: str, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE tokenizer (as GPT-2's) trained on ``text``; ``<|endoftext|>`` is its one special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    return tok


def window(ids: np.ndarray, T: int, end: int, vocab_size: int, rng, shares=SHARES) -> np.ndarray:
    """One training window of ``T + 1`` tokens, ``end`` first, then one of the three kinds above."""
    kind = rng.choice(3, p=shares)
    if kind == 0:                                                # the text as it is
        s = rng.integers(0, len(ids) - T)
        body = ids[s:s + T]
    elif kind == 1:                                              # a passage, then the text again from its start
        m, s = rng.integers(4, T // 2 + 1), rng.integers(0, len(ids) - T)
        body = np.concatenate([ids[s:s + m], ids[s:s + T - m]])
    else:                                                        # random ids, then the same ids again
        m = rng.integers(4, T // 2 + 1)
        r = rng.integers(0, vocab_size, size=m)
        body = np.resize(r, T)                                   # r, r, r, ... cut to T
    return np.concatenate([[end], body])                        # (T+1,)


# the loss and its gradient: the one transformer's readable backward pass, for GPT-2's settings
loss_and_grads = transformer_backward.loss_and_grads


def train(params: dict, cfg: C.TransformerConfig, ids: np.ndarray, end: int, *, steps: int,
          batch_size: int = 16, lr: float = 3e-3, seed: int = 0, shares=SHARES, log=print) -> list[float]:
    """Adam on batches of :func:`window`, through the training loop every model shares
    (:mod:`core.training.loop`); ``params`` in place."""
    names = list(C.param_shapes(cfg))
    flat, views = pack({n: params[n] for n in names})
    grads = np.empty_like(flat)
    rng = np.random.default_rng(seed)

    def windows(step):                      # a batch of windows: the tokens, and the tokens after them
        w = np.stack([window(ids, cfg.n_ctx, end, cfg.vocab_size, rng, shares) for _ in range(batch_size)])
        return w[:, :-1], w[:, 1:]                                                 # (B, T) each

    def gradient(x, y, out):
        loss, g = loss_and_grads(views, cfg, x, y)
        out[:] = np.concatenate([g[n].reshape(-1) for n in names])
        return loss

    def rate(step):                         # a 100-step warm-up, then a half cosine down to 55 %
        return lr * min(1.0, (step + 1) / 100) * (0.55 + 0.45 * math.cos(math.pi * step / max(steps - 1, 1)))

    update = loop.gradient_update(gradient, flat, grads, optim.Adam(flat.size, flat.dtype, lr))
    losses = []
    for s in loop.steps(update, windows, stop=steps, rate=rate):
        losses.append(s.loss)
        if log and (s.step % 250 == 0 or s.step == steps - 1):
            log(f"step {s.step:5d}  loss {np.mean(losses[-50:]):.3f}")
    for n in names:
        params[n] = np.array(views[n])
    return losses


def make(out: str = OUT, *, steps: int = 6000, seed: int = 0, vocab_size: int = VOCAB_SIZE,
         shares=SHARES, log=print, **sizes) -> dict:
    """Train the tokenizer and the model on corpus.txt and save the checkpoint in ``out``."""
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    tok = train_tokenizer(text, vocab_size)
    ids = np.asarray(tok.encode(text).ids, dtype=np.int64)
    cfg = C.TransformerConfig(vocab_size=tok.get_vocab_size(), **{**CONFIG, **sizes})
    params = C.init_params(cfg, seed=seed, dtype=np.float32)
    # learned positions, started from the sinusoidal code: "one step back" is then one fixed rotation
    # of it, which the previous-token head finds (from small random positions it did not, in 6000 steps)
    params["pos"] = (0.5 * positional.sinusoidal(cfg.n_ctx, cfg.d_model)).astype(np.float32)
    start = time.perf_counter()
    losses = train(params, cfg, ids, tok.token_to_id(END), steps=steps, seed=seed, shares=shares, log=log)
    if log:
        log(f"{len(ids)} tokens, vocabulary {cfg.vocab_size}, {C.param_count(cfg):,} parameters, "
            f"{steps} steps in {time.perf_counter() - start:.0f} s; final loss {np.mean(losses[-50:]):.3f}")
    pretrained.save(params, cfg, out, tokenizer=tok)
    return {"config": cfg, "losses": losses}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make(args.out, steps=args.steps, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
