"""Plain NumPy versions of every operation, written like the formulas.

This module is the oracle: every Numba kernel (CPU and CUDA) is tested against it.
It favours clarity over speed and never calls a kernel.
"""
from __future__ import annotations

import numpy as np


def softmax(S: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, safe for ``-inf`` entries.

    ``softmax(s)_j = exp(s_j - max s) / sum_k exp(s_k - max s)``; a row whose entries are all
    ``-inf`` (nothing allowed) gives all zeros instead of NaN.
    """
    S = np.asarray(S)
    row_max = S.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    E = np.exp(S - row_max)                       # exp(-inf) = 0 for masked entries
    Z = E.sum(axis=-1, keepdims=True)
    return np.divide(E, Z, out=np.zeros_like(E), where=Z > 0)


def scaled_scores(Q: np.ndarray, K: np.ndarray, mask: np.ndarray | None = None,
                  scale: float | None = None) -> np.ndarray:
    """``S = Q K^T * scale + M`` with ``scale = 1/sqrt(d_k)`` by default."""
    if scale is None:
        scale = 1.0 / np.sqrt(Q.shape[-1])
    S = (Q @ np.swapaxes(K, -1, -2)) * scale      # (..., Tq, Tk)
    if mask is not None:
        S = S + mask
    return S


def attention(Q, K, V, mask=None, scale=None):
    """Scaled dot-product attention: ``A = softmax(Q K^T / sqrt(d_k) + M)``, ``out = A V``.

    Returns ``(out, A)`` like the Annotated Transformer's ``attention()``.
    """
    A = softmax(scaled_scores(Q, K, mask, scale))
    return A @ V, A


def split_heads(X: np.ndarray, n_heads: int) -> np.ndarray:
    """``(..., T, H*d) -> (..., H, T, d)``."""
    *lead, T, D = X.shape
    X = X.reshape(*lead, T, n_heads, D // n_heads)   # (..., T, H, d)
    return np.swapaxes(X, -3, -2)                     # (..., H, T, d)


def merge_heads(X: np.ndarray) -> np.ndarray:
    """``(..., H, T, d) -> (..., T, H*d)``: the concatenation of the heads along features."""
    X = np.swapaxes(X, -3, -2)                        # (..., T, H, d)
    *lead, T, H, d = X.shape
    return X.reshape(*lead, T, H * d)


def multi_head_attention(X, W_Q, W_K, W_V, W_O, n_heads, mask=None, *,
                         b_Q=None, b_K=None, b_V=None, b_O=None, X_kv=None):
    """Multi-head attention, step by step.

    ``head_h = Attention(X W_Q^h, X_kv W_K^h, X_kv W_V^h)``, ``O = Concat(head_1..H) W_O``.
    Returns a dict with ``weights, head_outputs, concat, output``.
    """
    X_kv = X if X_kv is None else X_kv
    zero = 0.0
    # 1. project (one matmul per Q, K, V computes every head at once)
    Q = X @ W_Q + (zero if b_Q is None else b_Q)       # (..., Tq, H*d_k)
    K = X_kv @ W_K + (zero if b_K is None else b_K)    # (..., Tk, H*d_k)
    V = X_kv @ W_V + (zero if b_V is None else b_V)    # (..., Tk, H*d_v)
    # 2. split into heads
    Qh, Kh, Vh = (split_heads(M, n_heads) for M in (Q, K, V))   # (..., H, T, d)
    # 3. attend per head; a mask without a head axis is shared by every head
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim >= 2:
            mask = np.expand_dims(mask, -3)            # (..., 1, Tq, Tk)
    heads, A = attention(Qh, Kh, Vh, mask)             # (..., H, Tq, d_v), (..., H, Tq, Tk)
    # 4. concatenate and project back to d_model
    concat = merge_heads(heads)                        # (..., Tq, H*d_v)
    output = concat @ W_O + (zero if b_O is None else b_O)
    return {"weights": A, "head_outputs": heads, "concat": concat, "output": output}


def filter_bank(X, W_V, W_O, weights, n_heads, b_V=None):
    """Per-head terms ``A_h (X W_V^h + b_V^h) W_O^(h)``, stacked on a head axis.

    Their sum over heads equals ``Concat @ W_O`` (without ``b_O``).
    """
    d_v = W_V.shape[1] // n_heads
    terms = []
    for h in range(n_heads):
        cols = slice(h * d_v, (h + 1) * d_v)
        V_h = X @ W_V[:, cols] + (0.0 if b_V is None else b_V[cols])   # (..., Tk, d_v)
        terms.append(weights[..., h, :, :] @ V_h @ W_O[cols, :])         # (..., Tq, d_model)
    return np.stack(terms, axis=-3)                                     # (..., H, Tq, d_model)


def causal_mask(T: int, dtype=np.float64) -> np.ndarray:
    """``M_ij = 0`` if ``j <= i`` else ``-inf``."""
    i, j = np.indices((T, T))
    return np.where(j <= i, 0.0, -np.inf).astype(dtype)


def padding_mask(lengths, T: int, dtype=np.float64) -> np.ndarray:
    """``(B, 1, T)``: key ``j`` of sequence ``b`` is allowed when ``j < lengths[b]``."""
    lengths = np.asarray(lengths).reshape(-1, 1, 1)
    j = np.arange(T).reshape(1, 1, T)
    return np.where(j < lengths, 0.0, -np.inf).astype(dtype)


def sinusoidal(T: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))``."""
    p = np.arange(T)[:, None]
    two_i = np.arange(0, d_model, 2)[None, :]
    angle = p / base ** (two_i / d_model)
    PE = np.zeros((T, d_model))
    PE[:, 0::2] = np.sin(angle)
    PE[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return PE
