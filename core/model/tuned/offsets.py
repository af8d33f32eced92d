"""Where the compiled steps find each parameter: the one layout builder.

A model trained on the compiled track keeps its parameters in one flat buffer, packed in
``param_shapes(cfg)`` order (:func:`core.model.params.pack`). The compiled kernels read it through
offsets: each block's arrays in a fixed slot order (``sublayers.LAYER_SLOTS``,
``decoder_gradient.CROSS_SLOTS``: the names of the one vocabulary), and the stack's embedding,
positions and output layer. This module builds those offsets from the parameter names, for an
encoder classifier (:func:`encoder_layout`), a decoder-only language model or an encoder-decoder
(:func:`decoder_layout`), and the positional table each stack adds (:func:`positions`).
"""
from __future__ import annotations

import functools

import numpy as np

from core.model import layers
from core.model import params as P
from core.model.tuned.decoder_gradient import CROSS_SLOTS, DecoderLayout
from core.model.tuned.sublayers import LAYER_SLOTS, Layout
from core.model.config import EMBEDDING_POSITIONAL, TransformerConfig, param_shapes
from core.model.transformer_encdec import EncoderDecoderConfig
from core.model.transformer_encdec import param_shapes as encdec_shapes

# What the compiled steps compute: the original Transformer's blocks (post-norm LayerNorm, ReLU,
# biases) under a classifier head or an untied, biased unembedding. Anything else runs on the readable track.
_COMPILED = dict(norm_placement="post", norm="layernorm", activation="relu", bias=True, tied_unembed=False,
                 final_ln=False, n_token_types=0, embed_ln=False, pooler=False, gated_ffn=False)
# the compiled steps add positions to the embeddings (rotary ones turn queries and keys: not here)
_COMPILED_POSITIONS = EMBEDDING_POSITIONAL


def unsupported(cfg) -> str | None:
    """Why the compiled steps cannot run ``cfg`` (a :class:`TransformerConfig` or an
    :class:`EncoderDecoderConfig`), or None when they can."""
    stacks = (cfg.encoder, cfg.decoder) if isinstance(cfg, EncoderDecoderConfig) else (cfg,)
    for stack in stacks:
        wrong = [f"{k}={getattr(stack, k)!r}" for k, v in _COMPILED.items() if getattr(stack, k) != v]
        if wrong:
            return "the compiled steps run post-norm LayerNorm ReLU blocks with biases only, not " + ", ".join(wrong)
        if stack.kv_heads != stack.n_heads:
            return f"the compiled steps give each query head its own key/value head, not n_kv_heads={stack.n_kv_heads}"
        if stack.positional not in _COMPILED_POSITIONS:
            return f"the compiled steps add positions to the embeddings, not positional={stack.positional!r}"
    head = stacks[-1]
    if head.head == "classify" and head.causal:
        return "the compiled classifier attends both ways (causal=False)"
    if head.head == "lm" and (not head.causal or not head.unembed_b):
        return "the compiled language model is causal, with an unembedding bias (unembed_b=True)"
    if head.head == "none":
        return "the compiled steps need a head: a classifier or a language model's unembedding"
    return None


def _check(cfg) -> None:
    reason = unsupported(cfg)
    if reason:
        raise ValueError(f"This model cannot train on the compiled step: {reason}.")


def _read_only(offsets: list, width: int) -> np.ndarray:
    """Offsets as an int64 array the kernels cannot write: every layout then has one Numba type,
    so the sublayers both compiled steps share compile once."""
    array = np.array(offsets, np.int64).reshape(-1, width) if width else np.array(offsets, np.int64)
    array.setflags(write=False)
    return array


def _stack(cfg: TransformerConfig, at: dict, prefix: str, out: tuple[str, str], n_out: int,
           present: bool = True) -> Layout:
    """One stack's :data:`Layout`: its blocks' slots (offset 0 for arrays it lacks, the
    feed-forward ones of an attention-only model: never read) and its ``top`` (embedding, learned
    positions or -1, the output weight and bias)."""
    rows = [[at.get(f"{prefix}blocks.{i}.{slot}", 0) for slot in LAYER_SLOTS]
            for i in range(cfg.n_layers if present else 0)]
    top = [at.get(f"{prefix}embed", 0), at.get(f"{prefix}pos", -1), at[out[0]], at[out[1]]]
    return Layout(vocab_size=cfg.vocab_size, n_ctx=cfg.n_ctx, d_model=cfg.d_model, n_heads=cfg.n_heads,
                  d_ff=cfg.d_ff, n_out=n_out, learned_positions=cfg.positional == "learned",
                  top=_read_only(top, 0), layers=_read_only(rows, len(LAYER_SLOTS)))


@functools.lru_cache(maxsize=64)
def encoder_layout(cfg: TransformerConfig) -> Layout:
    """Offsets of an encoder classifier's parameters (``param_shapes(cfg)`` order)."""
    _check(cfg)
    if cfg.head != "classify":
        raise ValueError("The compiled encoder step trains a classifier (head='classify').")
    return _stack(cfg, P.offsets(param_shapes(cfg)), "", ("classifier.W", "classifier.b"), cfg.n_classes)


@functools.lru_cache(maxsize=64)
def decoder_layout(cfg) -> DecoderLayout:
    """Offsets of a decoder-only language model's (a :class:`TransformerConfig`) or an
    encoder-decoder's parameters: the source stack (none for a decoder-only model), the target
    stack with the unembedding as its output, and each decoder block's cross-attention."""
    _check(cfg)
    out = ("unembed", "unembed_b")
    if isinstance(cfg, EncoderDecoderConfig):
        at, dec = P.offsets(encdec_shapes(cfg)), cfg.decoder
        enc = _stack(cfg.encoder, at, "enc.", out, dec.vocab_size)
        cross = [[at[f"dec.blocks.{i}.{slot}"] for slot in CROSS_SLOTS] for i in range(dec.n_layers)]
        return DecoderLayout(enc, _stack(dec, at, "dec.", out, dec.vocab_size), _read_only(cross, len(CROSS_SLOTS)))
    if cfg.head != "lm":
        raise ValueError("The compiled decoder step trains a language model (head='lm').")
    at = P.offsets(param_shapes(cfg))
    return DecoderLayout(_stack(cfg, at, "", out, cfg.vocab_size, present=False),
                         _stack(cfg, at, "", out, cfg.vocab_size), _read_only([], len(CROSS_SLOTS)))


def positions(flat: np.ndarray, stack: TransformerConfig, lay: Layout, T: int) -> np.ndarray:
    """``(T, d)``, read-only: what the stack (``stack``'s settings, ``lay`` its layout) adds to its
    first ``T`` embeddings: a view of the flat buffer for learned positions, else the sinusoidal
    table or zeros. Read-only always, so that each compiled step has one signature."""
    d = stack.d_model
    if stack.positional == "learned":
        at = int(lay.top[1])
        table = flat[at:at + T * d].reshape(T, d)
        table.setflags(write=False)
        return table
    return _fixed(stack.positional, T, d, flat.dtype.str)


@functools.lru_cache(maxsize=64)
def _fixed(kind: str, T: int, d: int, dtype_str: str) -> np.ndarray:
    if kind == "sinusoidal":
        return layers.sinusoid_table(T, d, dtype_str)
    table = np.zeros((T, d), np.dtype(dtype_str))
    table.setflags(write=False)
    return table
