"""The tiny transformer encoder: forward pass, hand-written backward pass and Adam, compiled.

Architecture (the original Transformer encoder: post-norm, ReLU, no dropout)::

    h = embed[tokens] + PE                                   # (B, T, d)
    for each block i:
        h = LN1(h + MHA(h))                                  # blocks.{i}.attn.W_Q ... b_O, blocks.{i}.ln1.g|b
        h = LN2(h + relu(h W_1 + b_1) W_2 + b_2)             # blocks.{i}.ffn.W_1 ... b_2, blocks.{i}.ln2.g|b
    logits = mean_over_positions(h) W + b                    # classifier.W, classifier.b: (B, C)
    loss = mean cross-entropy

The model is a setting of the one transformer (:func:`EncoderConfig` returns the
``encoder_classifier`` preset, a :class:`~core.model.config.TransformerConfig`), and its parameters
are that config's, in the one vocabulary (:func:`core.model.config.param_shapes`). They are computed
in their own dtype, float32 (fast, for training) or float64 (gradient checks). The computation is
compiled whole (``core/model/tuned/``): a forward pass, or a training step with its backward
pass and Adam, is one call into Numba. Its matrix products are our own, so nothing depends on a
BLAS thread pool, and a seed gives the same numbers bit for bit whatever else the process is doing.
The readable twin of this step is :func:`core.model.transformer_backward.loss_and_grads`.

Backend: ``backend=`` is accepted and resolved like everywhere else, but the encoder always runs
on the CPU kernels. A model this small (about 20k parameters, a 64 x 16 batch) is dominated by
launch and transfer overhead on a GPU, so there is deliberately no CUDA path.
"""
from __future__ import annotations

import functools

import numpy as np

from core import backend as _backend
from core.model import names
from core.model import params as P
from core.model import presets
from core.model.tuned import encoder_step as K
from core.model.tuned import offsets
from core.model.config import TransformerConfig, check_params, check_tokens, init_params, param_count, param_shapes
from core.model.optim import Adam


def EncoderConfig(vocab_size: int = 10, seq_len: int = 16, d_model: int = 32, n_heads: int = 4, d_ff: int = 64,
                  n_layers: int = 2, n_classes: int = 2, positional: str = "sinusoidal",
                  ln_eps: float = 1e-5) -> TransformerConfig:
    """The tiny encoder's settings under the design's names: the ``encoder_classifier`` preset
    (:func:`core.model.presets.encoder_classifier`), with ``seq_len`` its context ``n_ctx``."""
    return presets.encoder_classifier(vocab_size, seq_len, d_model, n_heads, d_ff, n_layers, n_classes,
                                      positional, ln_eps)


# ----------------------------------------------------------------------------------------------
# checks and the flat buffer
# ----------------------------------------------------------------------------------------------
def check_labels(labels, batch: int, cfg: TransformerConfig) -> np.ndarray:
    """Labels as a C-contiguous int64 ``(batch,)`` array of class ids ``0..n_classes-1``."""
    arr = np.asarray(labels)
    if arr.dtype.kind not in "iu" or arr.shape != (batch,):
        raise ValueError(f"Labels must be {batch} whole-number class ids, got {arr.dtype} with shape {arr.shape}.")
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.n_classes):
        raise ValueError(f"Labels must lie in 0..{cfg.n_classes - 1}.")
    return np.ascontiguousarray(arr, dtype=np.int64)


def flatten(params: dict, cfg: TransformerConfig) -> np.ndarray:
    """The parameters copied into one flat buffer in ``param_shapes(cfg)`` order, as the compiled
    step reads it (:func:`core.model.tuned.offsets.encoder_layout`)."""
    return P.pack({name: params[name] for name in param_shapes(cfg)})[0]


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
def forward(params: dict, tokens, cfg: TransformerConfig, *, backend=None):
    """Run the encoder on a batch of token ids.

    Parameters
    ----------
    params : dict from :func:`init_params` (or :func:`core.model.encoder_io.load`)
    tokens : int array (B, T) or (T,), ``T <= cfg.n_ctx``
    backend : resolved as elsewhere (``"cpu"``, ``"cuda"``, ``None``); the encoder always runs on the
        CPU kernels (a model this small gains nothing on a GPU).

    Returns
    -------
    logits : (B, C)
    cache : dict with ``attn`` (L, B, H, T, T), the attention weights of every layer and head (each
        row sums to 1); ``hidden`` (B, T, d), the final hidden states; ``pooled`` (B, d), their mean
        over positions; ``logits`` and ``tokens``. The same arrays under the one vocabulary's names
        too (views, not copies): ``blocks.{i}.attn.weights`` (B, H, T, T) and
        ``blocks.{L-1}.resid_post``, the names :func:`core.model.transformer.forward` gives them.
    """
    _backend.resolve(backend)
    check_params(params, cfg, finite=True)         # a model this small is scanned whole
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    B, T = tok.shape
    L, H, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    out = (np.empty((B, cfg.n_classes), flat.dtype), np.empty((L, B, H, T, T), flat.dtype),
           np.empty((B, T, d), flat.dtype), np.empty((B, d), flat.dtype))
    _run(K.FORWARD, flat, tok, None, cfg, out=out)
    logits, attn, hidden, pooled = out
    cache = {"attn": attn, "hidden": hidden, "pooled": pooled, "logits": logits, "tokens": tok,
             names.key(names.block(L - 1), "resid_post"): hidden}
    cache.update({names.key(names.block(i), "attn", "weights"): attn[i] for i in range(L)})
    return logits, cache


def predict_flat(flat: np.ndarray, tok: np.ndarray, cfg: TransformerConfig) -> np.ndarray:
    """Predicted class ids (arg-max of the logits), without checks, on a flat buffer (:func:`flatten`)
    and int64 tokens (B, T)."""
    logits = np.empty((tok.shape[0], cfg.n_classes), flat.dtype)
    _run(K.FORWARD, flat, tok, None, cfg, out=(logits, *_no_maps(flat.dtype)))
    return np.argmax(logits, axis=1)


@functools.lru_cache(maxsize=4)
def _no_maps(dtype) -> tuple:
    """Empty attention weights, hidden states and pooled states: a forward pass that keeps none."""
    return np.empty((0,) * 5, dtype), np.empty((0,) * 3, dtype), np.empty((0, 0), dtype)


def _run(mode, flat, tok, lab, cfg, *, grad_flat=None, optimizer=None, out=None):
    """One call of the compiled encoder (``core.model.tuned.encoder_step.run``), with empty
    stand-ins for the arrays ``mode`` does not use (Numba compiles one version per dtype, whatever
    the mode)."""
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
    layout = offsets.encoder_layout(cfg)
    pe = offsets.positions(flat, cfg, layout, tok.shape[1])
    return K.run(mode, flat, layout, tok, lab, pe, float(cfg.ln_eps), grad_flat, adam, out)


# ----------------------------------------------------------------------------------------------
# backward and the training step
# ----------------------------------------------------------------------------------------------
def loss_and_grads(params: dict, tokens, labels, cfg: TransformerConfig, *, backend=None):
    """Mean cross-entropy of the batch and its gradient for every parameter.

    Returns ``(loss, grads)``; ``grads`` has the same names, shapes and dtype as ``params``. The
    backward pass is written by hand, step by step, mirroring the forward pass
    (``core/model/tuned/``; CPU kernels, see the module docstring about ``backend``).
    """
    _backend.resolve(backend)
    check_params(params, cfg, finite=True)         # a model this small is scanned whole
    tok = check_tokens(tokens, cfg)
    lab = check_labels(labels, tok.shape[0], cfg)
    flat = flatten(params, cfg)
    grad_flat = np.empty_like(flat)
    loss, _ = _run(K.GRADIENT, flat, tok, lab, cfg, grad_flat=grad_flat)
    return float(loss), P.named_views(grad_flat, param_shapes(cfg))


def train_step(flat: np.ndarray, grad_flat: np.ndarray, optimizer: Adam, tok: np.ndarray, lab: np.ndarray,
               cfg: TransformerConfig) -> tuple[float, int]:
    """One training step, in place and in one compiled call: forward, backward, Adam.

    ``flat`` holds the parameters packed in ``param_shapes(cfg)`` order
    (:func:`core.model.params.pack` of :func:`init_params`'s dict, or :func:`flatten`), ``grad_flat``
    receives the gradient; ``tok`` int64 (B, T) and ``lab`` int64 (B,) are trusted (no checks).
    Returns the batch's mean loss before the update and its number of correct arg-max predictions.
    """
    if flat.size != _param_count(cfg) or grad_flat.shape != flat.shape or optimizer.m.shape != flat.shape:
        raise ValueError(f"The flat buffers hold {flat.size} numbers; this configuration has {param_count(cfg)}.")
    optimizer.t += 1
    loss, hits = _run(K.STEP, flat, tok, lab, cfg, grad_flat=grad_flat, optimizer=optimizer)
    return float(loss), int(hits)


# param_count walks every parameter's shape (about 14 us): once per configuration, not per step
_param_count = functools.lru_cache(maxsize=64)(param_count)


def warm_up(cfg: TransformerConfig, dtype=np.float32) -> None:
    """Compile (or load from Numba's on-disk cache) the training step and the forward pass for
    ``dtype``, on scratch data: the machine code depends on the dtype only, not on the sizes."""
    flat = flatten(init_params(cfg, dtype=dtype), cfg)
    tok, lab = np.zeros((1, cfg.n_ctx), np.int64), np.zeros(1, np.int64)
    train_step(flat, np.empty_like(flat), Adam(flat.size, flat.dtype), tok, lab, cfg)
    predict_flat(flat, tok, cfg)
