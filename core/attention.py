"""Public attention operations: validate, reshape to the kernels' 4-D layout, dispatch, reshape back.

Axis order, stated once: attention weights are ``[batch, head, query_pos, key_pos]``, activations
``[batch, pos, feature]``; the batch (and head) axes are optional. Weights are ``(d_in, d_out)``
and applied as ``X @ W``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from core import backend as _backend
from core.kernels.tuned import cpu as _cpu
from core.validate import (as_float_array, as_float_array_with_peak, check_heads, common_dtype, mask_values_ok,
                           max_abs, max_abs_of_each, require_ndim, require_nonempty, same_float_arrays)

__all__ = ["attention", "multi_head_attention", "filter_bank", "split_heads", "merge_heads",
           "MHAResult", "scores"]

_NO_MASK = {np.dtype(np.float32): np.zeros((1, 1, 1, 1), np.float32),
            np.dtype(np.float64): np.zeros((1, 1, 1, 1), np.float64)}


class MHAResult(NamedTuple):
    """Everything multi-head attention computes on the way, for the pages to show."""

    weights: np.ndarray        # (..., H, Tq, Tk)
    head_outputs: np.ndarray   # (..., H, Tq, d_v)
    concat: np.ndarray         # (..., Tq, H*d_v)
    output: np.ndarray         # (..., Tq, d_model)


# --- the head axis: pure reshapes ------------------------------------------------------------


def split_heads(X: np.ndarray, n_heads: int) -> np.ndarray:
    """``(..., T, H*d) -> (..., H, T, d)``: head ``h`` takes the packed columns ``h*d:(h+1)*d``."""
    *lead, T, D = X.shape
    X = X.reshape(*lead, T, n_heads, D // n_heads)   # (..., T, H, d)
    return np.swapaxes(X, -3, -2)                     # (..., H, T, d)


def merge_heads(X: np.ndarray) -> np.ndarray:
    """``(..., H, T, d) -> (..., T, H*d)``: the heads concatenated along features, head 1 first."""
    X = np.swapaxes(X, -3, -2)                        # (..., T, H, d)
    *lead, T, H, d = X.shape
    return X.reshape(*lead, T, H * d)                 # (..., T, H*d)


# --- input preparation ---------------------------------------------------------------------


def _as_4d(x: np.ndarray) -> np.ndarray:
    """Pad leading axes: (T, d) -> (1, 1, T, d); (B, T, d) -> (B, 1, T, d)."""
    if x.ndim == 4:
        return x
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _broadcasts(shape: tuple, target: tuple) -> bool:
    try:
        return len(shape) <= len(target) and np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _broadcasts_fast(shape: tuple, target: tuple) -> bool:
    """:func:`_broadcasts` without NumPy's machinery: each trailing axis is 1 or the target's."""
    if len(shape) > len(target):
        return False
    for n, t in zip(reversed(shape), reversed(target)):
        if n != 1 and n != t:
            return False
    return True


def _prepare_mask(mask, target: tuple, dtype) -> np.ndarray:
    """An additive mask as a compact 4-D array whose axes are 1 (broadcast) or full size.

    Boolean masks mean "may attend" where True (as in PyTorch) and become 0 / -inf.
    """
    if mask is None:
        return _NO_MASK[np.dtype(dtype)]
    if (type(mask) is np.ndarray and mask.dtype == dtype and mask.flags.c_contiguous
            and _broadcasts_fast(mask.shape, target)):
        # Hot path: already an additive mask of the right dtype; one compiled pass checks it.
        if not mask_values_ok(mask.ravel()):
            raise ValueError("The mask may hold 0, finite numbers or -inf, but not NaN or +inf.")
        return mask if mask.ndim == 4 else mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    m = np.asarray(mask)
    if m.dtype == bool:
        m = np.where(m, 0.0, -np.inf)
    elif m.dtype.kind not in "iuf":
        raise ValueError(f"The mask must be numeric (0 where allowed, -inf where not), got {m.dtype}.")
    if not _broadcasts(m.shape, tuple(target)):
        raise ValueError(f"The mask has shape {m.shape}, which does not broadcast to the attention "
                         f"scores' shape {tuple(target)} (..., queries, keys).")
    m = np.ascontiguousarray(m, dtype=dtype)
    if np.isnan(m).any() or (m == np.inf).any():
        raise ValueError("The mask may hold 0, finite numbers or -inf, but not NaN or +inf.")
    return m.reshape((1,) * (4 - m.ndim) + m.shape)


_LARGEST = {np.dtype(t): float(np.finfo(t).max) / 4 for t in (np.float32, np.float64)}


def _check_scores_fit(Q, K, scale, peak_Q=None, peak_K=None) -> None:
    """Refuse inputs whose scores would overflow the dtype (inf - inf would give NaN weights)."""
    peak_Q = max_abs(Q) if peak_Q is None else peak_Q
    peak_K = max_abs(K) if peak_K is None else peak_K
    # The kernels scale the queries before the dot products, so Q * scale must fit as well.
    bound = peak_Q * abs(scale) * max(peak_K * Q.shape[-1], 1.0)
    limit = _LARGEST[Q.dtype]
    if bound > limit:
        raise ValueError(
            f"Q and K are too large: their scores could reach {bound:.3g}, beyond what {Q.dtype} holds "
            f"({limit:.3g}). Use smaller values or float64.")


def _prepare_qkv(Q, K, V, scale, dtype):
    peaks = None
    if dtype is None and same_float_arrays(Q, K, V):
        # Hot path (the inputs are already what the kernels take): one compiled pass checks all
        # three; on NaN/inf the full path below runs and names the offending array.
        peaks = max_abs_of_each(Q, K, V)
        if not (math.isfinite(peaks[0]) and math.isfinite(peaks[1]) and math.isfinite(peaks[2])):
            peaks = None
    if peaks is not None:
        peak_Q, peak_K = peaks[0], peaks[1]
    else:
        dtype = dtype or common_dtype(Q, K, V)
        Q, peak_Q = as_float_array_with_peak(Q, "Q", dtype)
        K, peak_K = as_float_array_with_peak(K, "K", dtype)
        V = as_float_array(V, "V", dtype)
    for x, name in ((Q, "Q"), (K, "K"), (V, "V")):
        require_ndim(x, name, 2, 4)
        require_nonempty(x, name)
    if not (Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]):
        raise ValueError(f"Q, K and V must share their batch/head axes; got shapes {Q.shape}, {K.shape}, {V.shape}.")
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Queries and keys must have the same width d_k: Q has {Q.shape[-1]}, K has {K.shape[-1]}.")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K and V must have one row per key position: K has {K.shape[-2]}, V has {V.shape[-2]}.")
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    elif not math.isfinite(scale):
        raise ValueError(f"The score scale must be a finite number, got {scale}.")
    _check_scores_fit(Q, K, scale, peak_Q, peak_K)
    return Q, K, V, float(scale)


def _small_attention(Q, K, V, mask, scale):
    """``(out, A)`` from :func:`core.kernels.tuned.cpu.small_attention`'s single compiled call (checks and
    arithmetic together) when the inputs allow it, else None: then the ordinary path runs, and
    raises its precise message for inputs that failed a check."""
    if not (same_float_arrays(Q, K, V) and Q.ndim == K.ndim == V.ndim and 2 <= Q.ndim <= 4):
        return None
    d_k = Q.shape[-1]
    if Q.size // d_k * K.shape[-2] * (d_k + V.shape[-1] + 8) > _cpu.SMALL_MAX_WORK:
        return None                          # too big: the kernel's own work count, Tq*Tk*(d_k+d_v+8)
    if scale is None:
        scale = math.nan                     # the kernel's "use 1/sqrt(d_k)"
    elif type(scale) is not float or not math.isfinite(scale):
        return None
    if mask is None:
        mask = _NO_MASK[Q.dtype]
    elif not (type(mask) is np.ndarray and mask.dtype == Q.dtype and mask.ndim <= 4
              and mask.flags.c_contiguous):
        return None                          # boolean, other dtype, lists: converted by the ordinary path
    status, out, A = _cpu.small_attention(Q, K, V, mask, scale, _LARGEST[Q.dtype],
                                          _cpu.PARALLEL_MIN_WORK)
    return (out, A) if status == _cpu.SMALL_OK else None


# --- public operations ------------------------------------------------------------------------


def attention(Q, K, V, mask=None, *, return_weights=True, scale=None, backend=None):
    r"""Scaled dot-product attention.

    .. math:: A = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right), \qquad out = A V

    Parameters
    ----------
    Q, K, V : arrays ``(..., Tq, d_k)``, ``(..., Tk, d_k)``, ``(..., Tk, d_v)``; up to two leading
        axes (batch, head), the same for all three.
    mask : additive mask broadcastable to ``(..., Tq, Tk)`` (0 allowed, -inf not), or boolean
        (True allowed). A query with nothing allowed gets zero weights and a zero output.
    return_weights : when False the fused kernel runs and no ``(Tq, Tk)`` tensor is materialised.
    scale : score scale; default ``1/sqrt(d_k)``.
    backend : ``"cpu"``, ``"cuda"``, ``"auto"`` or None (see :mod:`core.backend`).

    Returns
    -------
    out : ``(..., Tq, d_v)``
    weights : ``(..., Tq, Tk)`` or None
    """
    kern = _backend.kernels(backend)
    if return_weights and kern is _cpu:
        done = _small_attention(Q, K, V, mask, scale)
        if done is not None:
            return done
    Q, K, V, scale = _prepare_qkv(Q, K, V, scale, None)
    lead = Q.shape[:-2]
    Q4, K4, V4 = _as_4d(Q), _as_4d(K), _as_4d(V)
    mask4 = _prepare_mask(mask, Q4.shape[:2] + (Q.shape[-2], K.shape[-2]), Q.dtype)
    if not return_weights:
        out = kern.fused_attention(Q4, K4, V4, mask4, scale)
        return (out if Q.ndim == 4 else out.reshape(lead + out.shape[-2:])), None
    out, A = kern.attention_with_weights(Q4, K4, V4, mask4, scale)
    if Q.ndim == 4:
        return out, A
    return out.reshape(lead + out.shape[-2:]), A.reshape(lead + A.shape[-2:])


def scores(Q, K, mask=None, *, scale=None, backend=None):
    r"""The pre-softmax scores :math:`S = Q K^\top \cdot scale + M`, shape ``(..., Tq, Tk)``."""
    kern = _backend.kernels(backend)
    Q, K, _, scale = _prepare_qkv(Q, K, K, scale, None)
    lead = Q.shape[:-2]
    Q4, K4 = _as_4d(Q), _as_4d(K)
    mask4 = _prepare_mask(mask, Q4.shape[:2] + (Q.shape[-2], K.shape[-2]), Q.dtype)
    S = kern.scaled_scores(Q4, K4, mask4, scale)
    return S.reshape(lead + S.shape[-2:])


def _as_weight(W, name, rows, dtype):
    W = as_float_array(W, name, dtype)
    if W.ndim != 2:
        raise ValueError(f"{name} must be a matrix (d_in, d_out), got shape {W.shape}.")
    if rows is not None and W.shape[0] != rows:
        raise ValueError(f"{name} has {W.shape[0]} rows but its input has {rows} features.")
    return W


def _as_bias(b, name, width, dtype):
    if b is None:
        return np.zeros(width, dtype=dtype)
    b = as_float_array(b, name, dtype)
    if b.shape != (width,):
        raise ValueError(f"{name} must have shape ({width},), got {b.shape}.")
    return b


def _as_sequence(X, name, dtype):
    X = as_float_array(X, name, dtype)
    require_ndim(X, name, 2, 3)
    require_nonempty(X, name)
    return X


def multi_head_attention(X, W_Q, W_K, W_V, W_O, n_heads, mask=None, *,
                         b_Q=None, b_K=None, b_V=None, b_O=None, X_kv=None, backend=None) -> MHAResult:
    r"""Multi-head attention with packed projections.

    .. math::
        \mathrm{head}_h = \mathrm{softmax}\!\left(\frac{(X W_Q^h)(X_{kv} W_K^h)^\top}{\sqrt{d_k}} + M\right)
        X_{kv} W_V^h, \qquad O = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W_O

    Head ``h`` uses columns ``h*d_k:(h+1)*d_k`` of ``W_Q``/``W_K`` (``d_v`` for ``W_V``) and the
    row block ``h*d_v:(h+1)*d_v`` of ``W_O``.

    Parameters
    ----------
    X : ``(T, d_model)`` or ``(B, T, d_model)``, the queries' sequence.
    W_Q, W_K, W_V : ``(d_model, H*d_k)``, ``(d_kv, H*d_k)``, ``(d_kv, H*d_v)``.
    W_O : ``(H*d_v, d_out)``.
    n_heads : H; must divide the projection widths.
    mask : broadcastable to ``(Tq, Tk)``, ``(B, Tq, Tk)`` or ``(B, H, Tq, Tk)``; a mask without a
        head axis is shared by every head.
    X_kv : the sequence keys and values come from (cross-attention); default ``X``.

    Returns
    -------
    MHAResult(weights, head_outputs, concat, output)
    """
    kern = _backend.kernels(backend)
    dtype = common_dtype(X, W_Q, W_K, W_V, W_O, X_kv)
    X = _as_sequence(X, "X", dtype)
    X_kv = X if X_kv is None else _as_sequence(X_kv, "X_kv", dtype)
    if X.ndim != X_kv.ndim or X.shape[:-2] != X_kv.shape[:-2]:
        raise ValueError(f"X and X_kv must have the same batch size; got shapes {X.shape} and {X_kv.shape}.")
    W_Q = _as_weight(W_Q, "W_Q", X.shape[-1], dtype)
    W_K = _as_weight(W_K, "W_K", X_kv.shape[-1], dtype)
    W_V = _as_weight(W_V, "W_V", X_kv.shape[-1], dtype)
    d_k = check_heads(W_Q.shape[1], n_heads)
    d_v = check_heads(W_V.shape[1], n_heads)
    if W_K.shape[1] != W_Q.shape[1]:
        raise ValueError(f"W_Q and W_K must have the same width (H*d_k); got {W_Q.shape[1]} and {W_K.shape[1]}.")
    W_O = _as_weight(W_O, "W_O", n_heads * d_v, dtype)
    b_Q = _as_bias(b_Q, "b_Q", W_Q.shape[1], dtype)
    b_K = _as_bias(b_K, "b_K", W_K.shape[1], dtype)
    b_V = _as_bias(b_V, "b_V", W_V.shape[1], dtype)
    b_O = _as_bias(b_O, "b_O", W_O.shape[1], dtype)

    batched = X.ndim == 3
    X3 = X if batched else X[None]                       # (B, Tq, d_model)
    Xkv3 = X_kv if batched else X_kv[None]               # (B, Tk, d_kv)
    B, Tq, Tk = X3.shape[0], X3.shape[1], Xkv3.shape[1]

    # 1. project, the head split folded into the store
    Q = kern.project_heads(X3, W_Q, b_Q, n_heads)        # (B, H, Tq, d_k)
    K = kern.project_heads(Xkv3, W_K, b_K, n_heads)      # (B, H, Tk, d_k)
    V = kern.project_heads(Xkv3, W_V, b_V, n_heads)      # (B, H, Tk, d_v)
    _check_scores_fit(Q, K, 1.0 / math.sqrt(d_k))
    # 2. one mask for every head unless it carries a head axis of its own
    if mask is not None and np.ndim(mask) in (2, 3):
        m = np.asarray(mask)
        mask = m.reshape(m.shape[:-2] + (1,) + m.shape[-2:]) if m.ndim == 3 else m
    mask4 = _prepare_mask(mask, (B, n_heads, Tq, Tk), dtype)
    # 3. attend per head
    heads, A = kern.attention_with_weights(Q, K, V, mask4, 1.0 / math.sqrt(d_k))  # (B,H,Tq,d_v), (B,H,Tq,Tk)
    # 4. concatenate along features and project back to the model width
    concat = merge_heads(heads)                                      # (B, Tq, H*d_v)
    output = kern.merge_heads_project(heads, W_O, b_O)              # (B, Tq, d_out)
    if not batched:
        A, heads, concat, output = A[0], heads[0], concat[0], output[0]
    return MHAResult(A, heads, concat, output)


def filter_bank(X, W_V, W_O, weights, n_heads, *, b_V=None, backend=None):
    r"""The per-head terms of multi-head attention's output, computed from their factors.

    .. math:: \mathrm{Concat} \cdot W_O = \sum_h A_h (X W_V^h + b_V^h) W_O^{(h)}

    Parameters
    ----------
    X : ``(..., Tk, d_model)``; W_V ``(d_model, H*d_v)``; W_O ``(H*d_v, d_out)``.
    weights : ``(..., H, Tq, Tk)``, e.g. ``multi_head_attention(...).weights``.

    Returns
    -------
    ``(..., H, Tq, d_out)``: term ``h`` is head ``h``'s analysis filter ``A_h`` followed by its
    synthesis filter ``W_O^(h)`` (row block ``h`` of ``W_O``).
    """
    kern = _backend.kernels(backend)
    dtype = common_dtype(X, W_V, W_O, weights)
    X = _as_sequence(X, "X", dtype)
    W_V = _as_weight(W_V, "W_V", X.shape[-1], dtype)
    d_v = check_heads(W_V.shape[1], n_heads)
    W_O = _as_weight(W_O, "W_O", n_heads * d_v, dtype)
    A = as_float_array(weights, "weights", dtype)
    batched = X.ndim == 3
    X3 = X if batched else X[None]
    A4 = A if A.ndim == 4 else A[None]
    if A4.shape[0] != X3.shape[0] or A4.shape[1] != n_heads or A4.shape[3] != X3.shape[1]:
        raise ValueError(f"weights of shape {A.shape} do not match {n_heads} heads over {X3.shape[1]} positions.")
    V = kern.project_heads(X3, W_V, _as_bias(b_V, "b_V", W_V.shape[1], dtype), n_heads)  # (B, H, Tk, d_v)
    filtered = kern.weighted_sum(np.ascontiguousarray(A4), V)                           # (B, H, Tq, d_v)
    no_bias = np.zeros(W_O.shape[1], dtype=dtype)
    terms = np.stack([
        kern.merge_heads_project(np.ascontiguousarray(filtered[:, h:h + 1]),
                                 np.ascontiguousarray(W_O[h * d_v:(h + 1) * d_v]), no_bias)
        for h in range(n_heads)], axis=1)                                               # (B, H, Tq, d_out)
    return terms if batched else terms[0]
