"""The tiny transformer encoder: forward pass, hand-written backward pass, Adam, save and load.

Architecture (the original Transformer encoder: post-norm, ReLU, no dropout)::

    h = embed[tokens] + PE                                   # (B, T, d)
    for each layer:
        h = LN1(h + MHA(h))                                  # MHA with biases b_Q, b_K, b_V, b_O
        h = LN2(h + relu(h W_1 + b_1) W_2 + b_2)
    logits = mean_over_positions(h) W_cls + b_cls           # (B, C)
    loss = mean cross-entropy

Parameters are a ``dict[str, np.ndarray]`` (names in ``param_shapes``) and are computed in their
own dtype, float32 (fast, for training) or float64 (gradient checks). The computation is compiled
whole (``core/encoder_kernels.py``): a forward pass, or a training step with its backward pass and
Adam, is one call into Numba. Its matrix products are our own, so nothing depends on a BLAS thread
pool, and a seed gives the same numbers bit for bit whatever else the process is doing.

Backend: ``backend=`` is accepted and resolved like everywhere else, but the encoder always runs
on the CPU kernels. A model this small (about 20k parameters, a 64 x 16 batch) is dominated by
launch and transfer overhead on a GPU, so there is deliberately no CUDA path.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import re
import zipfile

import numpy as np

from core import backend as _backend
from core.models import encoder_kernels as K
from core.models.encoder_kernels import LAYER_PARAMS
from core.models.layers import init_by_name, sinusoid_table
from core.validate import check_heads

POSITIONAL_CHOICES = ("sinusoidal", "learned", "none")


# ----------------------------------------------------------------------------------------------
# configuration and parameters
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the tiny encoder; checked on creation (``ValueError`` in the user's terms)."""

    vocab_size: int = 10
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    n_classes: int = 2
    positional: str = "sinusoidal"
    ln_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "d_ff", "n_layers", "n_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2 for a classifier, got {self.n_classes}.")
        check_heads(self.d_model, self.n_heads)
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL_CHOICES)}, "
                             f"got {self.positional!r}.")
        if not (isinstance(self.ln_eps, (int, float)) and math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a small positive number, got {self.ln_eps!r}.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


def param_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order."""
    d, V, T, F, C = cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.d_ff, cfg.n_classes
    shapes: dict[str, tuple[int, ...]] = {"embed": (V, d)}
    if cfg.positional == "learned":
        shapes["pos"] = (T, d)
    per_layer = {"W_Q": (d, d), "W_K": (d, d), "W_V": (d, d), "W_O": (d, d),
                 "b_Q": (d,), "b_K": (d,), "b_V": (d,), "b_O": (d,),
                 "ln1_g": (d,), "ln1_b": (d,), "ln2_g": (d,), "ln2_b": (d,),
                 "W_1": (d, F), "b_1": (F,), "W_2": (F, d), "b_2": (d,)}
    for i in range(cfg.n_layers):
        for name in LAYER_PARAMS:
            shapes[f"layers.{i}.{name}"] = per_layer[name]
    shapes["W_cls"] = (d, C)
    shapes["b_cls"] = (C,)
    return shapes


@functools.lru_cache(maxsize=64)
def param_count(cfg: EncoderConfig) -> int:
    """Number of trainable numbers in the model."""
    return int(sum(np.prod(s) for s in param_shapes(cfg).values()))


def init_params(cfg: EncoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters: weights ``N(0, 1/d_in)``, embeddings ``N(0, 1)``, learned positions
    ``N(0, 0.1^2)``, biases 0, layer-norm gains 1 (deterministic for a seed)."""
    return init_by_name(param_shapes(cfg), seed, dtype)


def positional_table(params: dict, cfg: EncoderConfig, T: int) -> np.ndarray:
    """The (T, d) table added to the embeddings: sinusoidal, the learned ``pos`` rows, or zeros."""
    dtype = params["embed"].dtype
    if cfg.positional == "learned":
        return params["pos"][:T]
    return _fixed_table(cfg.positional, T, cfg.d_model, dtype.str)


@functools.lru_cache(maxsize=64)
def _fixed_table(kind: str, T: int, d: int, dtype_str: str) -> np.ndarray:
    """The sinusoidal table (:func:`core.models.layers.sinusoid_table`) or zeros; read-only."""
    if kind == "sinusoidal":
        return sinusoid_table(T, d, dtype_str)
    table = np.zeros((T, d), dtype=np.dtype(dtype_str))
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=64)
def layout(cfg: EncoderConfig) -> K.Layout:
    """Where each parameter of ``cfg`` starts in a flat buffer packed in ``param_shapes`` order."""
    offsets = _offsets(cfg)
    top = np.array([offsets["embed"], offsets.get("pos", -1), offsets["W_cls"], offsets["b_cls"]], dtype=np.int64)
    layers = np.array([[offsets[f"layers.{i}.{name}"] for name in LAYER_PARAMS] for i in range(cfg.n_layers)],
                      dtype=np.int64).reshape(cfg.n_layers, len(LAYER_PARAMS))
    top.setflags(write=False)
    layers.setflags(write=False)
    return K.Layout(cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_classes,
                    cfg.positional == "learned", top, layers)


def flatten(params: dict, cfg: EncoderConfig) -> np.ndarray:
    """The parameters copied into one flat buffer in ``param_shapes`` order (see :func:`layout`)."""
    return np.concatenate([np.ravel(params[name]) for name in param_shapes(cfg)])


def _pe_for(flat: np.ndarray, cfg: EncoderConfig, T: int) -> np.ndarray:
    """The (T, d) positional table for a flat buffer (for learned positions, a view of it)."""
    if cfg.positional == "learned":
        at = int(layout(cfg).top[K.POS])
        view = flat[at:at + T * cfg.d_model].reshape(T, cfg.d_model)
        view.setflags(write=False)        # read-only like the fixed tables: one compiled signature
        return view
    return _fixed_table(cfg.positional, T, cfg.d_model, flat.dtype.str)


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------
def check_params(params: dict, cfg: EncoderConfig) -> np.dtype:
    """Refuse missing/extra names, wrong shapes, mixed or non-float dtypes, NaN/inf. Returns the dtype."""
    expected = param_shapes(cfg)
    missing = [n for n in expected if n not in params]
    extra = [n for n in params if n not in expected]
    if missing:
        raise ValueError(f"Parameters are missing {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''} for this configuration.")
    if extra:
        raise ValueError(f"Unexpected parameters {', '.join(extra[:5])}"
                         f"{' ...' if len(extra) > 5 else ''} for this configuration.")
    dtype = np.asarray(params["embed"]).dtype
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype} for 'embed'.")
    for name, shape in expected.items():
        arr = params[name]
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"Parameter {name!r} is not a NumPy array.")
        if arr.shape != shape:
            raise ValueError(f"Parameter {name!r} has shape {arr.shape}; this configuration needs {shape}.")
        if arr.dtype != dtype:
            raise ValueError(f"Parameter {name!r} is {arr.dtype} but 'embed' is {dtype}; use one dtype.")
        if not np.isfinite(arr).all():
            raise ValueError(f"Parameter {name!r} contains NaN or infinity.")
    return dtype


def check_tokens(tokens, cfg: EncoderConfig) -> np.ndarray:
    """Tokens as a C-contiguous int64 (B, T) array with ``1 <= T <= seq_len`` and ids in range."""
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"Tokens must be whole-number ids, got values of type {arr.dtype}.")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"Tokens must be a non-empty (batch, positions) array, got shape {arr.shape}.")
    if arr.shape[1] > cfg.seq_len:
        raise ValueError(f"Sequences have {arr.shape[1]} tokens, but the model was built for at most "
                         f"seq_len = {cfg.seq_len}.")
    if arr.min() < 0 or arr.max() >= cfg.vocab_size:
        raise ValueError(f"Token ids must lie in 0..{cfg.vocab_size - 1} (vocab_size = {cfg.vocab_size}); "
                         f"got {arr.min()}..{arr.max()}.")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_labels(labels, batch: int, cfg: EncoderConfig) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.dtype.kind not in "iu" or arr.shape != (batch,):
        raise ValueError(f"Labels must be {batch} whole-number class ids, got {arr.dtype} with shape {arr.shape}.")
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.n_classes):
        raise ValueError(f"Labels must lie in 0..{cfg.n_classes - 1}.")
    return np.ascontiguousarray(arr, dtype=np.int64)


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
def forward(params: dict, tokens, cfg: EncoderConfig, *, backend=None):
    """Run the encoder on a batch of token ids.

    Parameters
    ----------
    params : dict from :func:`init_params` (or :func:`load`)
    tokens : int array (B, T) or (T,), ``T <= cfg.seq_len``
    backend : resolved as elsewhere (``"cpu"``, ``"cuda"``, ``None``); the encoder always runs on the
        CPU kernels (a model this small gains nothing on a GPU).

    Returns
    -------
    logits : (B, C)
    cache : dict with ``attn`` (L, B, H, T, T), the attention weights of every layer and head (each
        row sums to 1); ``hidden`` (B, T, d), the final hidden states; ``pooled`` (B, d), their mean
        over positions; ``logits`` and ``tokens``.
    """
    _backend.resolve(backend)
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    B, T = tok.shape
    L, H, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    out = (np.empty((B, cfg.n_classes), flat.dtype), np.empty((L, B, H, T, T), flat.dtype),
           np.empty((B, T, d), flat.dtype), np.empty((B, d), flat.dtype))
    _run(K.FORWARD, flat, tok, None, cfg, out=out)
    logits, attn, hidden, pooled = out
    return logits, {"attn": attn, "hidden": hidden, "pooled": pooled, "logits": logits, "tokens": tok}


def predict(params: dict, tokens, cfg: EncoderConfig) -> np.ndarray:
    """Predicted class ids (arg-max of the logits)."""
    check_params(params, cfg)
    return predict_flat(flatten(params, cfg), check_tokens(tokens, cfg), cfg)


def predict_flat(flat: np.ndarray, tok: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """:func:`predict` without checks, on a flat buffer (:func:`flatten`) and int64 tokens (B, T)."""
    logits = np.empty((tok.shape[0], cfg.n_classes), flat.dtype)
    _run(K.FORWARD, flat, tok, None, cfg, out=(logits, *_no_maps(flat.dtype)))
    return np.argmax(logits, axis=1)


@functools.lru_cache(maxsize=4)
def _no_maps(dtype) -> tuple:
    """Empty attention weights, hidden states and pooled states: a forward pass that keeps none."""
    return np.empty((0,) * 5, dtype), np.empty((0,) * 3, dtype), np.empty((0, 0), dtype)


def _run(mode, flat, tok, lab, cfg, *, grad_flat=None, optimizer=None, out=None):
    """One call of the compiled encoder (``core.models.encoder_kernels.run``), with empty stand-ins for the
    arrays ``mode`` does not use (Numba compiles one version per dtype, whatever the mode)."""
    dtype = flat.dtype
    nothing = np.empty(0, dtype)
    lab = np.empty(0, np.int64) if lab is None else lab
    grad_flat = nothing if grad_flat is None else grad_flat
    if optimizer is None:
        adam = (nothing, nothing, 0.0, 0.0, 0.0, 0.0, 0)
    else:
        adam = (optimizer.m, optimizer.v, optimizer.lr, optimizer.beta1, optimizer.beta2, optimizer.eps,
                optimizer.t)
    out = (np.empty((0, 0), dtype), *_no_maps(dtype)) if out is None else out
    return K.run(mode, flat, layout(cfg), tok, lab, _pe_for(flat, cfg, tok.shape[1]), float(cfg.ln_eps),
                 grad_flat, adam, out)


# ----------------------------------------------------------------------------------------------
# the forward cache: every intermediate of the forward pass, by name, and head ablation
# ----------------------------------------------------------------------------------------------
# Names of the per-layer entries of :func:`forward_cache`, in the order the forward pass makes them
# (``cache[f"layers.{i}.{name}"]``); shapes for a batch of B sequences of T tokens.
CACHE_LAYER_ENTRIES = {
    "resid_pre": "(B, T, d)    the layer's input h",
    "q": "(B, H, T, d_k) queries h W_Q + b_Q, split by head",
    "k": "(B, H, T, d_k) keys",
    "v": "(B, H, T, d_k) values",
    "weights": "(B, H, T, T) attention weights softmax(q k^T / sqrt(d_k)), rows sum to 1",
    "head_outputs": "(B, H, T, d_k) each head's weights @ v (after any head ablation)",
    "concat": "(B, T, d)    the heads' outputs side by side",
    "attn_out": "(B, T, d)    concat W_O + b_O, the attention sublayer's output",
    "ln1_in": "(B, T, d)    the first residual sum h + attn_out, before LayerNorm 1",
    "ln1_mean": "(B, T)       its mean over the d features",
    "ln1_rstd": "(B, T)       1 / sqrt(var + eps) of it",
    "ln1_xhat": "(B, T, d)    normalised: (ln1_in - mean) * rstd, before gain and bias",
    "ln1_out": "(B, T, d)    ln1_g * xhat + ln1_b",
    "ffn_pre": "(B, T, d_ff) ln1_out W_1 + b_1, before the ReLU",
    "ffn_hidden": "(B, T, d_ff) relu(ffn_pre)",
    "ffn_out": "(B, T, d)    ffn_hidden W_2 + b_2",
    "ln2_in": "(B, T, d)    the second residual sum ln1_out + ffn_out",
    "ln2_mean": "(B, T)",
    "ln2_rstd": "(B, T)",
    "ln2_xhat": "(B, T, d)",
    "ln2_out": "(B, T, d)    the layer's output: the next layer's resid_pre",
}


def forward_cache(params: dict, tokens, cfg: EncoderConfig, *, head_scale=None, head_fill=None):
    """The forward pass with every intermediate kept, by name: what a page reads instead of
    recomputing.

    It runs the compiled kernels of :func:`forward` (``core.models.encoder_kernels``), on the same
    chunks of ``CHUNK`` sequences and in the same order as its ``forward_chunk``, one kernel call
    per step, and keeps what ``forward_chunk`` keeps for the backward pass (the layer inputs,
    queries/keys/values, attention weights, heads' outputs, normalised sums and ``1/std``, ReLU
    outputs) plus the few values it only holds in a scratch buffer (each sublayer's output, the
    residual sums before the norms, the FFN's pre-activation). The logits, attention weights and
    hidden states equal :func:`forward`'s bit for bit (tests check it).

    Head ablation (``head_scale``, ``head_fill``): between the attention and ``W_O``, head ``h`` of
    layer ``i`` has its output ``z`` (B, T, d_k) replaced by

        ``z <- s z + (1 - s) f``,   ``s = head_scale[i, h]``, ``f = head_fill[i][:, h d_k:(h+1) d_k]``

    ``head_scale`` (L, H) of 1 (None) changes nothing; 0 removes a head: its output becomes the
    fill, zero (``head_fill`` None) or e.g. its mean over a data set (``head_fill`` (L, T, d),
    per position and feature, in the ``concat`` layout). Heads whose scale is exactly 1 are not
    touched, so ablating nothing reproduces :func:`forward` exactly. Removing every head of a
    layer leaves that sublayer's output equal to ``b_O`` (to ``fill W_O + b_O`` with a fill).

    Returns
    -------
    logits : (B, C)
    cache : dict: ``tokens`` (B, T); ``tok_embed`` (B, T, d) the embedding rows and ``pos_embed``
        (T, d) the positional table; ``layers.{i}.{name}`` for every ``name`` of
        :data:`CACHE_LAYER_ENTRIES`; ``hidden`` (B, T, d) the encoder's output, ``pooled`` (B, d)
        its mean over positions, ``logits`` (B, C); ``attn`` (L, B, H, T, T) as :func:`forward`
        returns it.
    """
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    scale, fill = _check_ablation(head_scale, head_fill, cfg, tok.shape[1], flat.dtype)
    return _forward_steps(flat, tok, cfg, scale, fill, keep=True)


def forward_ablated(params: dict, tokens, cfg: EncoderConfig, head_scale, head_fill=None) -> np.ndarray:
    """The logits (B, C) of :func:`forward_cache` with the same head ablation, keeping nothing else
    (cheap enough to score a test set once per head)."""
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    scale, fill = _check_ablation(head_scale, head_fill, cfg, tok.shape[1], flat.dtype)
    return _forward_steps(flat, tok, cfg, scale, fill, keep=False)[0]


def _check_ablation(head_scale, head_fill, cfg: EncoderConfig, T: int, dtype):
    """``head_scale`` as (L, H) floats (None: all ones) and ``head_fill`` as (L, T, d) or None."""
    L, H, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    scale = np.ones((L, H)) if head_scale is None else np.asarray(head_scale, dtype=float)
    if scale.shape != (L, H) or not np.isfinite(scale).all():
        raise ValueError(f"head_scale must be {L} x {H} finite numbers (layers x heads), got shape {scale.shape}.")
    if head_fill is None:
        return scale, None
    fill = np.asarray(head_fill, dtype=dtype)
    if fill.shape[:1] + fill.shape[2:] != (L, d) or fill.ndim != 3 or fill.shape[1] < T or not np.isfinite(fill).all():
        raise ValueError(f"head_fill must be finite numbers of shape (layers, positions >= {T}, d_model) = "
                         f"({L}, {T}, {d}), got shape {fill.shape}.")
    return scale, np.ascontiguousarray(fill[:, :T])


def _forward_steps(flat, tok, cfg: EncoderConfig, scale, fill, *, keep: bool):
    """:func:`forward_cache`'s work on checked inputs: chunk by chunk as ``encoder_kernels.run``."""
    lay = layout(cfg)
    B, T = tok.shape
    pe = _pe_for(flat, cfg, T)
    Wqkv, bqkv = K.packed_qkv(flat, lay)
    logits = np.empty((B, cfg.n_classes), flat.dtype)
    parts = []
    for b0 in range(0, B, K.CHUNK):
        b1 = min(B, b0 + K.CHUNK)
        chunk = K.padded_chunk(tok, b0, b1, flat)
        acts = K.new_activations(lay, T, chunk.shape[0], flat)
        extra = _chunk_steps(flat, cfg, Wqkv, bqkv, chunk, pe, acts, scale, fill)
        logits[b0:b1] = acts.logits[:b1 - b0]
        if keep:
            parts.append(_by_sequence(acts, extra, cfg, b1 - b0))
    if not keep:
        return logits, None
    cache = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    cache["tokens"] = tok
    cache["tok_embed"] = _mat_view(flat, cfg, "embed")[tok]
    cache["pos_embed"] = np.array(pe)
    cache["logits"] = logits
    cache["attn"] = np.stack([cache[f"layers.{i}.weights"] for i in range(cfg.n_layers)])
    return logits, cache


def _mat_view(flat, cfg: EncoderConfig, name: str) -> np.ndarray:
    """Parameter ``name`` as a view of the flat buffer."""
    at, shape = int(_offsets(cfg)[name]), param_shapes(cfg)[name]
    return flat[at:at + int(np.prod(shape))].reshape(shape)


@functools.lru_cache(maxsize=64)
def _offsets(cfg: EncoderConfig) -> dict:
    """Each parameter's first index in the flat buffer (``param_shapes`` order)."""
    offsets, at = {}, 0
    for name, shape in param_shapes(cfg).items():
        offsets[name] = at
        at += int(np.prod(shape))
    return offsets


def _chunk_steps(flat, cfg: EncoderConfig, Wqkv, bqkv, tokens, pe, acts, scale, fill) -> dict:
    """``encoder_kernels.forward_chunk``, step by step: the same kernels, called in the same order
    on the same arrays, writing the same ``acts``; returns what it keeps only in scratch:
    ``attn_out``, ``ln1_in``, ``ffn_pre``, ``ffn_out``, ``ln2_in`` (each (L, features, N))."""
    Bp, T = tokens.shape
    L, d, F, N = cfg.n_layers, cfg.d_model, cfg.d_ff, T * Bp
    dt, eps = flat.dtype, float(cfg.ln_eps)
    lanes = acts.P.shape[-1]
    kept = {name: np.empty((L, rows, N), dt)
            for name, rows in (("attn_out", d), ("ln1_in", d), ("ffn_pre", F), ("ffn_out", d), ("ln2_in", d))}
    sub = np.empty((d, N), dt)
    position = (np.arange(N) // lanes) % T                          # the position of each column
    # 1. h = embed[tokens] + PE                                                   x[0]: (d, N)
    K.embed_forward(tokens, _mat_view(flat, cfg, "embed"), pe, acts.x[0])
    for i in range(L):
        p = {name: _mat_view(flat, cfg, f"layers.{i}.{name}") for name in LAYER_PARAMS}
        x, qkv, ctx, h1, a = acts.x[i], acts.qkv[i], acts.ctx[i], acts.h1[i], acts.a[i]
        # 2. [q; k; v] = (h [W_Q | W_K | W_V] + [b_Q | b_K | b_V])^T                qkv: (3d, N)
        K.project(Wqkv[i], x, qkv, qkv, False)
        K.add_bias(qkv, bqkv[i])
        # 3. every head: softmax(q k^T / sqrt(d_k)) v                    P: (H, Bv, T, T, lanes), ctx: (d, N)
        K.attention_forward(qkv, 0, qkv, d, 2 * d, False, acts.P[i], ctx)
        # 3b. head ablation: z_h <- s z_h + (1 - s) fill_h, only for heads with s != 1
        for h in np.flatnonzero(scale[i] != 1.0):
            rows = slice(h * cfg.d_k, (h + 1) * cfg.d_k)
            ctx[rows] *= dt.type(scale[i, h])
            if fill is not None:
                ctx[rows] += dt.type(1.0 - scale[i, h]) * fill[i][position, rows].T
        # 4. h1 = LN1(h + ctx W_O + b_O); the kernel adds (h + ctx W_O) + b_O, and so do we
        K.project(p["W_O"], ctx, sub, sub, False)
        kept["attn_out"][i] = sub + p["b_O"][:, None]
        kept["ln1_in"][i] = x + sub + p["b_O"][:, None]
        K.residual_layernorm(x, sub, p["b_O"], p["ln1_g"], p["ln1_b"], eps, h1, acts.xhat1[i], acts.rstd1[i])
        # 5. a = relu(h1 W_1 + b_1)                                                 a: (d_ff, N)
        K.project(p["W_1"], h1, a, a, False)
        kept["ffn_pre"][i] = a + p["b_1"][:, None]
        K.bias_relu(a, p["b_1"])
        # 6. h = LN2(h1 + a W_2 + b_2), the next layer's input                    x[i+1]: (d, N)
        K.project(p["W_2"], a, sub, sub, False)
        kept["ffn_out"][i] = sub + p["b_2"][:, None]
        kept["ln2_in"][i] = h1 + sub + p["b_2"][:, None]
        K.residual_layernorm(h1, sub, p["b_2"], p["ln2_g"], p["ln2_b"], eps, acts.x[i + 1], acts.xhat2[i],
                             acts.rstd2[i])
    # 7. logits = mean over positions of h, then W_cls and b_cls       pooled: (d, Bp), logits: (Bp, C)
    K.mean_pool(acts.x[L], T, acts.pooled)
    K.classify(acts.pooled, _mat_view(flat, cfg, "W_cls"), _mat_view(flat, cfg, "b_cls"), acts.logits)
    return kept


def _by_sequence(acts, kept: dict, cfg: EncoderConfig, n: int) -> dict:
    """A chunk's activations, from the kernels' (features, N) column layout back to (sequence,
    position, ...), for its first ``n`` sequences (the rest are padding)."""
    L, H, dk, d = cfg.n_layers, cfg.n_heads, cfg.d_k, cfg.d_model
    Bv, T, lanes = acts.P.shape[2], acts.P.shape[3], acts.P.shape[-1]
    b, t = np.arange(n)[:, None], np.arange(T)[None, :]
    col = ((b // lanes) * T + t) * lanes + b % lanes                 # (n, T): K.column(b, t, T, lanes)

    def tokens_first(rows):                                          # (F, N) -> (n, T, F)
        return np.ascontiguousarray(rows[:, col].transpose(1, 2, 0))

    def stats(row):                                                  # (N,) -> (n, T)
        return np.ascontiguousarray(row[col])

    out = {}
    for i in range(L):
        qkv = tokens_first(acts.qkv[i]).reshape(n, T, 3, H, dk).transpose(2, 0, 3, 1, 4)  # (3, n, H, T, dk)
        concat = tokens_first(acts.ctx[i])
        ln1_in, ln2_in = tokens_first(kept["ln1_in"][i]), tokens_first(kept["ln2_in"][i])
        # mean as the kernel sums it: feature by feature in order, then times 1/d
        inv_d = acts.x.dtype.type(1.0 / d)
        out.update({
            f"layers.{i}.resid_pre": tokens_first(acts.x[i]),
            f"layers.{i}.q": np.ascontiguousarray(qkv[0]), f"layers.{i}.k": np.ascontiguousarray(qkv[1]),
            f"layers.{i}.v": np.ascontiguousarray(qkv[2]),
            f"layers.{i}.weights": np.ascontiguousarray(
                acts.P[i].transpose(1, 4, 0, 2, 3).reshape(Bv * lanes, H, T, T)[:n]),
            f"layers.{i}.head_outputs": np.ascontiguousarray(concat.reshape(n, T, H, dk).transpose(0, 2, 1, 3)),
            f"layers.{i}.concat": concat,
            f"layers.{i}.attn_out": tokens_first(kept["attn_out"][i]),
            f"layers.{i}.ln1_in": ln1_in,
            f"layers.{i}.ln1_mean": stats(kept["ln1_in"][i].sum(axis=0) * inv_d),
            f"layers.{i}.ln1_rstd": stats(acts.rstd1[i]),
            f"layers.{i}.ln1_xhat": tokens_first(acts.xhat1[i]),
            f"layers.{i}.ln1_out": tokens_first(acts.h1[i]),
            f"layers.{i}.ffn_pre": tokens_first(kept["ffn_pre"][i]),
            f"layers.{i}.ffn_hidden": tokens_first(acts.a[i]),
            f"layers.{i}.ffn_out": tokens_first(kept["ffn_out"][i]),
            f"layers.{i}.ln2_in": ln2_in,
            f"layers.{i}.ln2_mean": stats(kept["ln2_in"][i].sum(axis=0) * inv_d),
            f"layers.{i}.ln2_rstd": stats(acts.rstd2[i]),
            f"layers.{i}.ln2_xhat": tokens_first(acts.xhat2[i]),
            f"layers.{i}.ln2_out": tokens_first(acts.x[i + 1]),
        })
    out["hidden"] = tokens_first(acts.x[L])
    out["pooled"] = np.ascontiguousarray(acts.pooled[:, :n].T)
    return out


# ----------------------------------------------------------------------------------------------
# backward and the training step
# ----------------------------------------------------------------------------------------------
def loss_and_grads(params: dict, tokens, labels, cfg: EncoderConfig, *, backend=None):
    """Mean cross-entropy of the batch and its gradient for every parameter.

    Returns ``(loss, grads)``; ``grads`` has the same names, shapes and dtype as ``params``. The
    backward pass is written by hand, step by step, mirroring the forward pass
    (``core/encoder_kernels.py``; CPU kernels, see the module docstring about ``backend``).
    """
    _backend.resolve(backend)
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    lab = check_labels(labels, tok.shape[0], cfg)
    flat = flatten(params, cfg)
    grad_flat = np.empty_like(flat)
    loss, _ = _run(K.GRADIENT, flat, tok, lab, cfg, grad_flat=grad_flat)
    grads, at = {}, 0
    for name, shape in param_shapes(cfg).items():
        size = int(np.prod(shape))
        grads[name] = grad_flat[at:at + size].reshape(shape).copy()
        at += size
    return float(loss), grads


def train_step(flat: np.ndarray, grad_flat: np.ndarray, optimizer: "Adam", tok: np.ndarray, lab: np.ndarray,
               cfg: EncoderConfig) -> tuple[float, int]:
    """One training step, in place and in one compiled call: forward, backward, Adam.

    ``flat`` holds the parameters packed in ``param_shapes`` order (:func:`pack` of
    :func:`init_params`'s dict, or :func:`flatten`), ``grad_flat`` receives the gradient; ``tok``
    int64 (B, T) and ``lab`` int64 (B,) are trusted (no checks). Returns the batch's mean loss
    before the update and its number of correct arg-max predictions.
    """
    if flat.size != param_count(cfg) or grad_flat.shape != flat.shape or optimizer.m.shape != flat.shape:
        raise ValueError(f"The flat buffers hold {flat.size} numbers; this configuration has {param_count(cfg)}.")
    optimizer.t += 1
    loss, hits = _run(K.STEP, flat, tok, lab, cfg, grad_flat=grad_flat, optimizer=optimizer)
    return float(loss), int(hits)


def warm_up(cfg: EncoderConfig, dtype=np.float32) -> None:
    """Compile (or load from Numba's on-disk cache) the training step and the forward pass for
    ``dtype``, on scratch data: the machine code depends on the dtype only, not on the sizes."""
    flat = flatten(init_params(cfg, dtype=dtype), cfg)
    tok, lab = np.zeros((1, cfg.seq_len), np.int64), np.zeros(1, np.int64)
    train_step(flat, np.empty_like(flat), Adam(flat.size, flat.dtype), tok, lab, cfg)
    predict_flat(flat, tok, cfg)


# ----------------------------------------------------------------------------------------------
# Adam
# ----------------------------------------------------------------------------------------------
def pack(params: dict) -> tuple[np.ndarray, dict]:
    """Copy parameters into one flat buffer; return it and a dict of views into it (same names).

    Updating the flat buffer (one Adam kernel call) updates every view at once.
    """
    dtype = next(iter(params.values())).dtype
    total = sum(v.size for v in params.values())
    flat = np.empty(total, dtype=dtype)
    views, offset = {}, 0
    for name, value in params.items():
        view = flat[offset:offset + value.size].reshape(value.shape)
        view[...] = value
        views[name] = view
        offset += value.size
    return flat, views


class Adam:
    """Adam (Kingma & Ba) with bias correction, on one flat parameter buffer.

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
    ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1-b1^t)``, ``v_hat = v / (1-b2^t)``.
    """

    def __init__(self, size: int, dtype=np.float32, lr: float = 3e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(betas[0]), float(betas[1]), float(eps)
        self.m = np.zeros(size, dtype=dtype)
        self.v = np.zeros(size, dtype=dtype)
        self.t = 0

    def step(self, flat_params: np.ndarray, flat_grads: np.ndarray) -> None:
        """Update ``flat_params`` in place from ``flat_grads``."""
        self.t += 1
        K.adam_update(flat_params, flat_grads, self.m, self.v, self.lr, self.beta1, self.beta2,
                      self.eps, self.t)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Adam":
        opt = cls(state["m"].size, state["m"].dtype, state["lr"], (state["beta1"], state["beta2"]), state["eps"])
        opt.m[:] = state["m"]
        opt.v[:] = state["v"]
        opt.t = int(state["t"])
        return opt


# ----------------------------------------------------------------------------------------------
# save and load
# ----------------------------------------------------------------------------------------------
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(\w+)$")


# Settings the weights alone do not determine, stored beside them as "config.<name>" arrays.
SETTINGS_PREFIX = "config."


def save(params: dict, path_or_file, cfg: EncoderConfig | None = None) -> None:
    """Write the parameters to an ``.npz`` archive, one array per design name.

    With ``cfg``, the head count and the kind of positional encoding are stored too
    (``config.n_heads``, ``config.positional``): the arrays' shapes do not tell them.
    """
    arrays = {name: np.asarray(value) for name, value in params.items()}
    if cfg is not None:
        arrays[SETTINGS_PREFIX + "n_heads"] = np.array(cfg.n_heads)
        arrays[SETTINGS_PREFIX + "positional"] = np.array(cfg.positional)
    np.savez(path_or_file, **arrays)


def load(path_or_file, cfg: EncoderConfig | None = None) -> dict[str, np.ndarray]:
    """Read parameters from an ``.npz`` file (no pickles) and check them.

    With ``cfg`` the names, shapes, dtype and finiteness are checked against it; without, a config
    is inferred (:func:`infer_config`, with the settings the file stores) and the parameters are
    checked against that. A file that is not a valid archive, or holds the wrong arrays, raises
    ``ValueError`` saying what is wrong.
    """
    return load_with_settings(path_or_file, cfg)[0]


def load_with_settings(path_or_file, cfg: EncoderConfig | None = None) -> tuple[dict, EncoderConfig, dict]:
    """:func:`load`, returning ``(params, cfg, settings)``: the parameters, the config they were
    checked against, and the settings the file stores (``{"n_heads": int, "positional": str}``,
    or fewer keys: none for a file saved without a config)."""
    raw = _read_bytes(path_or_file)
    if not raw.startswith(b"PK"):
        what = "a single .npy array" if raw.startswith(b"\x93NUMPY") else "it does not start like a zip file"
        raise ValueError(f"Could not read the parameter file: it is not a valid .npz archive ({what}).")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            params = {name: np.ascontiguousarray(archive[name]) for name in archive.files}
    except ValueError as err:   # e.g. an object array, which would need unpickling
        raise ValueError(f"Could not read the parameter file: {err}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, RuntimeError) as err:
        reason = str(err) or type(err).__name__
        raise ValueError(f"Could not read the parameter file: it is not a valid .npz archive ({reason}).") from None
    settings = _take_settings(params)
    if cfg is None:
        cfg = infer_config(params, **settings)
    else:
        check_params(params, cfg)
    return params, cfg, settings


def _take_settings(arrays: dict) -> dict:
    """Remove the ``config.*`` arrays from ``arrays`` and return them as checked settings."""
    settings = {}
    for name in [n for n in arrays if n.startswith(SETTINGS_PREFIX)]:
        key, value = name[len(SETTINGS_PREFIX):], arrays.pop(name)
        one = value.reshape(()) if value.size == 1 else None     # stored as a scalar (read back 1-D)
        if key == "n_heads" and one is not None and value.dtype.kind in "iu" and 1 <= one <= 4096:
            settings[key] = int(one)
        elif key == "positional" and one is not None and value.dtype.kind == "U" \
                and str(one) in POSITIONAL_CHOICES:
            settings[key] = str(one)
        else:
            raise ValueError(f"The parameter file's setting {name!r} is not one this encoder knows "
                             f"(n_heads: a whole number; positional: one of {', '.join(POSITIONAL_CHOICES)}).")
    return settings


def _read_bytes(path_or_file) -> bytes:
    """The whole file: from a path, raw bytes, or a binary file object (e.g. a Streamlit upload)."""
    if isinstance(path_or_file, (bytes, bytearray)):
        return bytes(path_or_file)
    if isinstance(path_or_file, (str, os.PathLike)):
        try:
            with open(path_or_file, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise ValueError(f"Could not read the parameter file: {os.fspath(path_or_file)} does not exist.") from None
        except OSError as err:
            raise ValueError(f"Could not read the parameter file: {err}.") from None
    if hasattr(path_or_file, "read"):
        if hasattr(path_or_file, "seek"):
            path_or_file.seek(0)
        data = path_or_file.read()
        if isinstance(data, (bytes, bytearray)):
            return bytes(data)
    raise ValueError("Could not read the parameter file: expected a path, bytes or a binary file object.")


def infer_config(params: dict, *, n_heads: int | None = None, positional: str | None = None,
                 ln_eps: float = 1e-5) -> EncoderConfig:
    """The :class:`EncoderConfig` a parameter dict belongs to (e.g. an uploaded file), checked.

    The weights do not determine the head count: ``n_heads`` when given, else the default 4 when
    that divides ``d_model``, else 1. ``positional`` is "learned" when a ``pos`` array is present
    (giving another kind then is an error), else "sinusoidal" unless given.
    """
    if not isinstance(params, dict) or "embed" not in params or "W_cls" not in params:
        raise ValueError("These are not encoder parameters: 'embed' and 'W_cls' are required.")
    embed, W_cls = np.asarray(params["embed"]), np.asarray(params["W_cls"])
    if embed.ndim != 2 or W_cls.ndim != 2:
        raise ValueError(f"'embed' and 'W_cls' must be matrices, got shapes {embed.shape} and {W_cls.shape}.")
    V, d = embed.shape
    layer_ids = {int(m.group(1)) for name in params if (m := _LAYER_NAME.match(name))}
    n_layers = len(layer_ids)
    if n_layers == 0 or layer_ids != set(range(n_layers)):
        raise ValueError(f"Layers must be numbered 0..L-1 with at least one layer, found {sorted(layer_ids)}.")
    W_1 = np.asarray(params.get("layers.0.W_1", np.empty((0, 0))))
    if W_1.ndim != 2:
        raise ValueError("'layers.0.W_1' must be a matrix.")
    if "pos" in params:
        pos = np.asarray(params["pos"])
        if pos.ndim != 2:
            raise ValueError(f"'pos' must be a (seq_len, d_model) matrix, got shape {pos.shape}.")
        if positional not in (None, "learned"):
            raise ValueError(f"The parameters hold a learned position table ('pos'), but the positional "
                             f"encoding is given as {positional!r}.")
        seq_len, positional = pos.shape[0], "learned"
    else:
        seq_len = 16
        positional = positional or "sinusoidal"
        if positional == "learned":
            raise ValueError("positional='learned' needs a 'pos' array in the parameters.")
    if n_heads is None:
        n_heads = 4 if d % 4 == 0 else 1
    cfg = EncoderConfig(vocab_size=V, seq_len=seq_len, d_model=d, n_heads=n_heads, d_ff=W_1.shape[1],
                        n_layers=n_layers, n_classes=W_cls.shape[1], positional=positional, ln_eps=ln_eps)
    check_params(params, cfg)
    return cfg
