"""Public attention operations: check the inputs, dispatch to the kernels, shape the results.

Axis order, stated once: attention weights are ``[batch, head, query_pos, key_pos]``, activations
``[batch, pos, feature]``; the batch (and head) axes are optional. Weights are ``(d_in, d_out)``
and applied as ``X @ W``.

Every operation follows the same three steps: its inputs pass the one set of rules in
``core/validate.py``; ``core/kernels/dispatch.py`` picks the kernels for the backend and the
problem size (the readable lesson kernels, or the tuned ones for large inputs) and runs them;
the results are reshaped to the inputs' leading axes.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from core.kernels import dispatch
from core.validate import (additive_mask, as_float_array, attention_inputs, check_arrays, check_heads,
                           common_dtype, require_ndim, require_nonempty)

__all__ = ["attention", "multi_head_attention", "filter_bank", "split_heads", "merge_heads",
           "MHAResult", "scores"]


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


# --- public operations ------------------------------------------------------------------------


def attention(Q, K, V, mask=None, *, return_weights=True, return_scores=False, scale=None, backend=None):
    r"""Scaled dot-product attention.

    .. math:: A = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right), \qquad out = A V

    Parameters
    ----------
    Q, K, V : arrays ``(..., Tq, d_k)``, ``(..., Tk, d_k)``, ``(..., Tk, d_v)``; up to two leading
        axes (batch, head), the same for all three.
    mask : additive mask broadcastable to ``(..., Tq, Tk)`` (0 allowed, -inf not), or boolean
        (True allowed). A query with nothing allowed gets zero weights and a zero output.
    return_weights : when False the fused kernel runs and no ``(Tq, Tk)`` tensor is materialised.
    return_scores : also return the scores :math:`S = Q K^\top \cdot scale + M` that the weights are
        the softmax of, as the kernels computed them on the way (-inf where masked): a page that
        draws both computes S once. Needs ``return_weights``.
    scale : score scale; default ``1/sqrt(d_k)``.
    backend : ``"cpu"``, ``"cuda"``, ``"auto"`` or None (see :mod:`core.backend`).

    Returns
    -------
    out : ``(..., Tq, d_v)``
    weights : ``(..., Tq, Tk)`` or None
    scores : ``(..., Tq, Tk)``, with ``return_scores`` only
    """
    # 1. the one set of input rules; the kernels' 4-D layout
    Q, K, V, mask, scale, lead = attention_inputs(Q, K, V, mask, scale)
    B, H, Tq, d_k = Q.shape
    Tk, d_v = V.shape[2], V.shape[3]
    # 2. the kernels for this backend and size (B*H*Tq*Tk*(d_k + d_v) multiply-adds)
    work = B * H * Tq * Tk * (d_k + d_v)
    if return_scores and not return_weights:
        raise ValueError("return_scores=True needs return_weights=True: the scores are kept on the way to "
                         "the weights.")
    if not return_weights:
        out = dispatch.run(backend, work, "fused_attention", Q, K, V, mask, scale)      # (B, H, Tq, d_v)
        return _leading(out, lead), None
    if return_scores:
        out, A, S = dispatch.run(backend, work, "attention_with_scores", Q, K, V, mask, scale)  # and S (B, H, Tq, Tk)
        return _leading(out, lead), _leading(A, lead), _leading(S, lead)
    out, A = dispatch.run(backend, work, "attention_with_weights", Q, K, V, mask, scale)  # and A (B, H, Tq, Tk)
    # 3. back to the inputs' leading axes
    if len(lead) == 2:
        return out, A
    return _leading(out, lead), _leading(A, lead)


def _leading(x: np.ndarray, lead: tuple) -> np.ndarray:
    """``(B, H, m, n) -> lead + (m, n)``: drop the axes of length 1 put in front of inputs that had
    fewer (an index, half the time of a reshape: a lesson-size call takes about 7 us)."""
    return x if len(lead) == 2 else x[(0,) * (2 - len(lead))]


def scores(Q, K, mask=None, *, scale=None, backend=None):
    r"""The pre-softmax scores :math:`S = Q K^\top \cdot scale + M`, shape ``(..., Tq, Tk)``."""
    Q, K, _, mask, scale, lead = attention_inputs(Q, K, K, mask, scale)
    B, H, Tq, d_k = Q.shape
    S = dispatch.run(backend, B * H * Tq * K.shape[2] * d_k, "scaled_scores", Q, K, mask, scale)  # (B, H, Tq, Tk)
    return _leading(S, lead)


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
    # 1. the inputs: numbers, shapes, a head count that divides the widths
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
    # one mask for every head unless it carries a head axis of its own
    if mask is not None and np.ndim(mask) in (2, 3):
        m = np.asarray(mask)
        mask = m.reshape(m.shape[:-2] + (1,) + m.shape[-2:]) if m.ndim == 3 else m
    mask = additive_mask(mask, dtype)
    run = dispatch.run

    # 2. project, the head split folded into the store
    Q = run(backend, X3.size * W_Q.shape[1], "project_heads", X3, W_Q, b_Q, n_heads)      # (B, H, Tq, d_k)
    K = run(backend, Xkv3.size * W_K.shape[1], "project_heads", Xkv3, W_K, b_K, n_heads)  # (B, H, Tk, d_k)
    V = run(backend, Xkv3.size * W_V.shape[1], "project_heads", Xkv3, W_V, b_V, n_heads)  # (B, H, Tk, d_v)
    scale = 1.0 / math.sqrt(d_k)
    check_arrays(Q, K, V, mask, scale, computed_from="X W + b")
    # 3. attend per head
    heads, A = run(backend, B * n_heads * Tq * Tk * (d_k + d_v), "attention_with_weights",
                   Q, K, V, mask, scale)                                   # (B, H, Tq, d_v), (B, H, Tq, Tk)
    # 4. concatenate along features and project back to the model width
    concat = merge_heads(heads)                                            # (B, Tq, H*d_v)
    output = run(backend, concat.size * W_O.shape[1], "merge_heads_project", heads, W_O, b_O)  # (B, Tq, d_out)
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
    dtype = common_dtype(X, W_V, W_O, weights)
    X = _as_sequence(X, "X", dtype)
    W_V = _as_weight(W_V, "W_V", X.shape[-1], dtype)
    d_v = check_heads(W_V.shape[1], n_heads)
    W_O = _as_weight(W_O, "W_O", n_heads * d_v, dtype)
    A = as_float_array(weights, "weights", dtype)
    batched = X.ndim == 3
    X3 = X if batched else X[None]                                                  # (B, Tk, d_model)
    A4 = A if A.ndim == 4 else A[None]                                              # (B, H, Tq, Tk)
    if A4.ndim != 4 or A4.shape[0] != X3.shape[0] or A4.shape[1] != n_heads or A4.shape[3] != X3.shape[1]:
        raise ValueError(f"weights of shape {A.shape} do not match {n_heads} heads over {X3.shape[1]} positions.")
    B, _, Tq, Tk = A4.shape
    d_out = W_O.shape[1]
    b_V = _as_bias(b_V, "b_V", W_V.shape[1], dtype)
    # 1. each head's values, X W_V^h + b_V^h
    V = dispatch.run(backend, X3.size * W_V.shape[1], "project_heads", X3, W_V, b_V, n_heads)  # (B, H, Tk, d_v)
    # 2. its analysis filter A_h
    filtered = dispatch.run(backend, A4.size * d_v, "weighted_sum", np.ascontiguousarray(A4), V)  # (B, H, Tq, d_v)
    # 3. its synthesis filter W_O^(h), the row block h*d_v:(h+1)*d_v
    no_bias = np.zeros(d_out, dtype=dtype)
    terms = np.stack([
        dispatch.run(backend, B * Tq * d_v * d_out, "merge_heads_project",
                     np.ascontiguousarray(filtered[:, h:h + 1]), np.ascontiguousarray(W_O[h * d_v:(h + 1) * d_v]),
                     no_bias)
        for h in range(n_heads)], axis=1)                                          # (B, H, Tq, d_out)
    return terms if batched else terms[0]
