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

import numpy as np

from core.model import layers as L
from core.model import params as P
# The model's settings, passes and generation live in their own modules; their public names are the
# decoder's too (``from core import decoder; decoder.generate``).
from core.model.decoder_config import (ATTENTION, CROSS_PARAMS, FFN_PARAMS, LAYER_PARAMS, POSITIONAL_CHOICES,
                                       DecoderConfig, init_params, param_count, param_shapes)
from core.model.decoder_passes import (attention_weights, check_params, check_tokens, forward,
                                        loss_and_grads)
from core.model.generation import Generation, generate

__all__ = ["ATTENTION", "CROSS_PARAMS", "FFN_PARAMS", "LAYER_PARAMS", "POSITIONAL_CHOICES", "DecoderConfig",
           "init_params", "param_count", "param_shapes", "check_params", "check_tokens", "forward",
           "loss_and_grads", "attention_weights", "generate", "Generation", "greedy_exact_match", "mean_loss", "pack",
           "ADAM_BETAS"]


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
# training's settings (the loop is core.training.decoder_runs.train)
# ----------------------------------------------------------------------------------------------
pack = P.pack
ADAM_BETAS = (0.9, 0.98)          # the original Transformer's
