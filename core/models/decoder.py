"""The decoder: an encoder-decoder and a decoder-only language model, with a hand-written backward
pass and generation one token at a time through a KV cache.

Architecture (the original Transformer: post-norm, ReLU, no dropout)::

    encoder (cross_attention=True only), on the source ids src (B, S):
        m = enc.embed[src] + PE                                   # (B, S, d)
        per layer:  m = LN1(m + MHA(m))
                    m = LN2(m + FFN(m))
    decoder, on the target ids tgt_in (B, T) (teacher forcing: the target shifted right):
        x = dec.embed[tgt_in] + PE                                # (B, T, d)
        per layer:  x = LN1(x + MHA(x, causal mask))              # masked self-attention
                    x = LN_cross(x + MHA(x, over m))              # cross-attention (encoder-decoder only)
                    x = LN2(x + FFN(x))
        logits = x W_out + b_out                                  # (B, T, V)
    loss = mean cross-entropy over every target position

Cross-attention takes its queries from the decoder and its keys and values from the encoder's
output ``m`` (the "memory"). A decoder-only layer is an encoder layer with a causal mask.

Parameters are a ``dict[str, np.ndarray]`` (names and shapes in :func:`param_shapes`) computed in
their own dtype, float32 or float64. Encoder layers use the encoder's names under ``enc.``
(``enc.layers.{i}.W_Q`` ...); decoder layers use the same names under ``dec.`` plus
``cross_W_Q ... cross_b_O`` and ``ln_cross_g, ln_cross_b`` for cross-attention.

Generation: with ``use_cache=True`` the prompt runs through the decoder once (filling the KV
cache), then each new token runs alone, its query attending over the cached keys and values of
every earlier position: O(T) work per token. With ``use_cache=False`` every step recomputes the
full causal forward pass over the whole prefix, O(T^2) work per token, and gives the same logits.
"""
from __future__ import annotations

import math

import numpy as np

from core.models import loop, optim
from core.models.steps import DEFAULT_TRACK, decoder_gradient
from core.models import layers as L
from core.models import params as P
# The model's settings, passes and generation live in their own modules; their public names are the
# decoder's too (``from core import decoder; decoder.generate``).
from core.models.decoder_config import (ATTENTION, CROSS_PARAMS, FFN_PARAMS, LAYER_PARAMS, POSITIONAL_CHOICES,
                                       DecoderConfig, init_params, param_count, param_shapes)
from core.models.decoder_passes import (_check_pair, attention_weights, check_params, check_tokens, forward,
                                        loss_and_grads)
from core.models.generation import Generation, generate

__all__ = ["ATTENTION", "CROSS_PARAMS", "FFN_PARAMS", "LAYER_PARAMS", "POSITIONAL_CHOICES", "DecoderConfig",
           "init_params", "param_count", "param_shapes", "check_params", "check_tokens", "forward",
           "loss_and_grads", "attention_weights", "generate", "Generation", "greedy_exact_match", "mean_loss", "pack",
           "ADAM_BETAS", "train"]


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------


def greedy_exact_match(params: dict, cfg: DecoderConfig, src, tgt_out, *, batch_size: int = 500) -> float:
    """Share of sequences whose greedy generation (from ``bos_id``) equals ``tgt_out`` at every position."""
    src, tgt_out = np.asarray(src), np.asarray(tgt_out)
    hits = 0
    for lo in range(0, len(src), batch_size):
        gen = generate(params, cfg, src[lo:lo + batch_size], max_new_tokens=tgt_out.shape[1], temperature=0)
        hits += int((gen.new_tokens == tgt_out[lo:lo + batch_size]).all(axis=1).sum())
    return hits / len(src)


def mean_loss(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None, *, batch_size: int = 500) -> float:
    """Mean cross-entropy over every position of a whole split (no gradients)."""
    check_params(params, cfg)
    total, count = 0.0, 0
    for lo in range(0, len(tgt_in), batch_size):
        chunk = slice(lo, lo + batch_size)
        logits = forward(params, cfg, tgt_in[chunk], None if src is None else src[chunk])[0]
        y = np.asarray(tgt_out[chunk])
        logp = L.log_softmax(logits.astype(np.float64))
        total += -np.take_along_axis(logp, y[..., None], axis=-1).sum()
        count += y.size
    return total / count


# ----------------------------------------------------------------------------------------------
# training: Adam on one flat buffer
# ----------------------------------------------------------------------------------------------
pack = P.pack
ADAM_BETAS = (0.9, 0.98)          # the original Transformer's


def train(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None, *, steps: int, batch_size: int = 64,
          lr: float = 3e-3, warmup: int = 50, seed: int = 0, callback=None, every: int = 0,
          on_params=None, track: str = DEFAULT_TRACK) -> list[float]:
    """Train ``params`` in place with Adam on random minibatches; return each step's loss.

    The learning rate rises linearly over ``warmup`` steps, then decays as a half cosine to a tenth
    of ``lr`` at the last step. ``callback(step, loss)``, if given, runs after every step; it may
    return True to stop early. ``on_params(step, params)``, if given, runs after every ``every``-th
    step but the last, with the parameters as they are then (views into the training buffer: read
    them, do not keep them). Each step's loss and gradient come from ``track``'s step
    (:mod:`core.models.steps`): ``"compiled"``, one Numba call (``core.models.decoder_step``), or
    ``"readable"``, the one transformer's forward and hand-written backward; the tests hold the two
    together.
    """
    check_params(params, cfg)
    tgt_all, src_all, _ = _check_pair(cfg, tgt_in, src)
    y_all = check_tokens(tgt_out, cfg.vocab_size, cfg.tgt_len, "The target output (tgt_out)")
    if y_all.shape != tgt_all.shape:
        raise ValueError("tgt_out must have the same shape as tgt_in.")
    if not P.whole(steps) or steps < 1 or not P.whole(batch_size) or batch_size < 1:
        raise ValueError("steps and batch_size must be positive whole numbers.")
    names = list(param_shapes(cfg))
    flat, views = pack({name: params[name] for name in names})      # flat follows the names' order
    gradient = decoder_gradient(track, cfg, flat)
    update = loop.gradient_update(gradient, flat, np.empty_like(flat), optim.Adam(flat.size, flat.dtype, lr,
                                                                                   betas=ADAM_BETAS))
    rng = np.random.default_rng(seed)

    def batch(step):
        idx = rng.integers(0, len(tgt_all), size=batch_size)
        return tgt_all[idx], y_all[idx], None if src_all is None else src_all[idx]

    def rate(step):                                 # linear warm-up, then a half cosine to a tenth
        progress = step / max(steps - 1, 1)
        return lr * min(1.0, (step + 1) / max(warmup, 1)) * (0.55 + 0.45 * math.cos(math.pi * progress))

    losses = []
    for s in loop.steps(update, batch, stop=steps, rate=rate):
        losses.append(s.loss)
        if callback is not None and callback(s.step, s.loss):
            break
        if on_params is not None and every > 0 and (s.step + 1) % every == 0 and s.step + 1 < steps:
            on_params(s.step + 1, views)
    for name in names:
        params[name][...] = views[name]
    return losses
