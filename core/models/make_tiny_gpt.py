"""The small GPT-2-format checkpoint the project ships, re-created from the text it ships.

    python -m core.models.make_tiny_gpt            # writes core/models/tiny_gpt/ (600 steps: 7 min on a busy 2-core machine)
    python -m core.models.make_tiny_gpt --out DIR --steps 600 --seed 0

1. A byte-level BPE tokenizer (GPT-2's kind, from the ``tokenizers`` library) is trained on
   ``core/models/corpus.txt``, with a small vocabulary.
2. A decoder-only transformer with GPT-2's architecture (pre-norm, GELU, learned positions, tied
   unembedding, final LayerNorm) is trained on that text to predict the next token, with Adam.
3. :func:`core.models.pretrained.save` writes ``config.json``, ``model.safetensors`` and
   ``tokenizer.json``: a folder that both :func:`pretrained.load` and ``transformers`` read.

The gradient is a hand-written backward pass through the sublayers of :mod:`core.models.layers`
(each has its backward there), held to finite differences by the tests.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

from core.models import decoder, pretrained
from core.models import layers as L
from core.models import transformer as tr

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


# ----------------------------------------------------------------------------------------------
# loss and gradient of a GPT-2-architecture model (pre-norm, GELU, learned positions, tied)
# ----------------------------------------------------------------------------------------------
def _attn(p: dict) -> dict:
    return {name: p[f"attn.{name}"] for name in L.ATTENTION_PARAMS}


def loss_and_grads(params: dict, cfg: tr.TransformerConfig, ids_in: np.ndarray, ids_out: np.ndarray):
    """Mean next-token cross-entropy on ``ids_in (B, T)`` against ``ids_out (B, T)``, and its
    gradient for every parameter, step by step in reverse."""
    B, T = ids_in.shape
    eps, H = cfg.ln_eps, cfg.n_heads
    mask = tr.causal_mask(T, 0, params["embed"].dtype)
    # forward, keeping what the backward pass needs
    h = params["embed"][ids_in] + params["pos"][:T]                              # (B, T, d)
    caches = []
    for i in range(cfg.n_layers):
        p = tr.block_params(params, f"blocks.{i}.")
        a, c_ln1 = L.layer_norm(h, p["ln1.g"], p["ln1.b"], eps)
        att, c_attn = L.attention(a, a, _attn(p), H, mask)
        h = h + att                                                               # resid_mid
        f, c_ln2 = L.layer_norm(h, p["ln2.g"], p["ln2.b"], eps)
        pre = L.linear(f, p["ffn.W_1"], p["ffn.b_1"])                             # (B, T, d_ff)
        hidden = L.gelu_tanh(pre)
        h = h + L.linear(hidden, p["ffn.W_2"], p["ffn.b_2"])                      # resid_post
        caches.append((p, c_ln1, c_attn, c_ln2, f, pre, hidden))
    hf, c_lnf = L.layer_norm(h, params["ln_final.g"], params["ln_final.b"], eps)
    logits = L.matmul(hf.reshape(B * T, -1), np.ascontiguousarray(params["embed"].T)).reshape(B, T, -1)
    loss, d_logits = L.cross_entropy(logits, ids_out)
    # backward
    g = {}
    dl = d_logits.reshape(B * T, -1)                                              # (N, V)
    g["embed"] = L.matmul(np.ascontiguousarray(dl.T), hf.reshape(B * T, -1))      # tied: the unembedding's share
    dh = L.matmul(dl, params["embed"]).reshape(B, T, -1)
    dh, g["ln_final.g"], g["ln_final.b"] = L.layer_norm_backward(dh, c_lnf)
    for i in reversed(range(cfg.n_layers)):
        p, c_ln1, c_attn, c_ln2, f, pre, hidden = caches[i]
        b = f"blocks.{i}."
        # h = h_mid + FFN(LN2(h_mid))
        d_hidden, g[b + "ffn.W_2"], g[b + "ffn.b_2"] = L.linear_backward(dh, hidden, p["ffn.W_2"])
        d_pre = L.gelu_tanh_backward(d_hidden, pre)
        d_f, g[b + "ffn.W_1"], g[b + "ffn.b_1"] = L.linear_backward(d_pre, f, p["ffn.W_1"])
        d_f, g[b + "ln2.g"], g[b + "ln2.b"] = L.layer_norm_backward(d_f, c_ln2)
        dh = dh + d_f
        # h_mid = h + MHA(LN1(h))
        dq, dkv, ga = L.attention_backward(dh, c_attn, _attn(p))
        d_a, g[b + "ln1.g"], g[b + "ln1.b"] = L.layer_norm_backward(dq + dkv, c_ln1)
        dh = dh + d_a
        g.update({f"{b}attn.{name}": value for name, value in ga.items()})
    np.add.at(g["embed"], ids_in.reshape(-1), dh.reshape(B * T, -1))
    g["pos"] = np.zeros_like(params["pos"])
    g["pos"][:T] = dh.sum(axis=0)
    return float(loss), g


def train(params: dict, cfg: tr.TransformerConfig, ids: np.ndarray, *, steps: int, batch_size: int = 16,
          lr: float = 3e-3, seed: int = 0, log=print) -> list[float]:
    """Adam on random windows of ``ids`` (the whole text as one stream of tokens); ``params`` in place."""
    names = list(tr.param_shapes(cfg))
    flat, views = decoder.pack({n: params[n] for n in names})
    opt = decoder.Adam(flat.size, flat.dtype, lr)
    rng = np.random.default_rng(seed)
    T = cfg.n_ctx
    losses = []
    for step in range(steps):
        starts = rng.integers(0, len(ids) - T - 1, size=batch_size)
        window = np.stack([ids[s:s + T + 1] for s in starts])                     # (B, T+1)
        loss, g = loss_and_grads(views, cfg, window[:, :-1], window[:, 1:])
        rate = lr * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(math.pi * step / max(steps - 1, 1)))
        opt.step(flat, np.concatenate([g[n].reshape(-1) for n in names]), rate)
        losses.append(loss)
        if log and (step % 100 == 0 or step == steps - 1):
            log(f"step {step:5d}  loss {loss:.3f}")
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
