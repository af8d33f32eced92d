"""Multi-head attention as a sublayer, self or cross: one readable forward (:func:`attention`, or
:func:`attend` over given keys and values, as a KV cache holds them) and its hand-written backward.

The rows of every head (scores, softmax, weighted sum, and their gradients) run as one compiled
loop per pass instead of a dozen NumPy steps with their temporaries; each loop has its NumPy
formula beside it, which runs while a freshly started server still compiles the loop
(:func:`core.model.layers.compiled_or`). The cache uses the project's vocabulary for what a forward
pass leaves behind: ``scores``, ``weights``, ``head_outputs``, ``concat``, ``output``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core.attention import merge_heads, split_heads    # heads are pure reshapes: one definition
from core.model.layers import compiled_or, linear, linear_backward


# ----------------------------------------------------------------------------------------------
# attention, row by row: one compiled loop per pass instead of a dozen NumPy steps with their temporaries
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _attention_rows(Q, K, V, mask, scale, S, A, Z):
    """For every batch b, head h and query i (``Q (B, H, Tq, d_k)``, ``K, V (B, H, Tk, d_k)``):

        S[i, j] = Q_i . K_j / scale + mask[i, j]           scores, with the additive mask (Tq, Tk)
        A[i, :] = softmax(S[i, :])                          -inf gets weight exactly 0; a row with
                                                            nothing allowed gets all zeros, never NaN
        Z[i]    = sum_j A[i, j] V_j                          the head's output for query i
    """
    B, H, Tq, d_k = Q.shape
    Tk = K.shape[2]
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                top = -np.inf
                for j in range(Tk):
                    dot = 0.0
                    for c in range(d_k):
                        dot += Q[b, h, i, c] * K[b, h, j, c]
                    S[b, h, i, j] = dot / scale + mask[i, j]
                    top = max(top, S[b, h, i, j])
                total = 0.0
                for j in range(Tk):
                    e = math.exp(S[b, h, i, j] - top) if top > -np.inf else 0.0
                    A[b, h, i, j] = e
                    total += e
                for j in range(Tk):
                    A[b, h, i, j] = A[b, h, i, j] / total if total > 0 else 0.0
                for c in range(d_k):
                    z = 0.0
                    for j in range(Tk):
                        z += A[b, h, i, j] * V[b, h, j, c]
                    Z[b, h, i, c] = z


@njit(cache=True, nogil=True)
def _attention_rows_backward(Q, K, V, A, dZ, scale, dQ, dK, dV):
    """Gradients of :func:`_attention_rows` from ``dZ``, for every (b, h), query i by query i:

        dA[j] = dZ_i . V_j            dV_j += A[i, j] dZ_i                 (Z_i = sum_j A[i, j] V_j)
        dS[j] = A[i, j] (dA[j] - sum_l A[i, l] dA[l]) / scale                 (softmax, then the scale)
        dQ_i  = sum_j dS[j] K_j       dK_j += dS[j] Q_i                    (S[i, j] = Q_i . K_j)

    Masked entries have A = 0, so they pass no gradient.
    """
    B, H, Tq, d_k = Q.shape
    Tk = K.shape[2]
    dA = np.empty(Tk)
    for b in range(B):
        for h in range(H):
            dK[b, h] = 0.0
            dV[b, h] = 0.0
            for i in range(Tq):
                mix = 0.0
                for j in range(Tk):
                    dot = 0.0
                    for c in range(d_k):
                        dot += dZ[b, h, i, c] * V[b, h, j, c]
                        dV[b, h, j, c] += A[b, h, i, j] * dZ[b, h, i, c]
                    dA[j] = dot
                    mix += A[b, h, i, j] * dot
                for c in range(d_k):
                    dQ[b, h, i, c] = 0.0
                for j in range(Tk):
                    dS = A[b, h, i, j] * (dA[j] - mix) / scale
                    for c in range(d_k):
                        dQ[b, h, i, c] += dS * K[b, h, j, c]
                        dK[b, h, j, c] += dS * Q[b, h, i, c]


def _attention_rows_numpy(Q, K, V, mask, scale, S, A, Z):
    """:func:`_attention_rows` over whole arrays: ``S = Q K^T / scale + mask``, ``A = softmax(S)``
    row by row (a row with nothing allowed all zeros), ``Z = A V``."""
    S[...] = Q @ K.swapaxes(-1, -2) / scale + mask
    top = S.max(axis=-1, keepdims=True)
    E = np.exp(S - np.where(top > -np.inf, top, 0.0))               # exp(-inf) = 0: masked keys
    total = E.sum(axis=-1, keepdims=True)
    np.divide(E, total, out=A, where=total > 0)
    A[np.broadcast_to(total == 0, A.shape)] = 0.0
    Z[...] = A @ V


def _attention_rows_backward_numpy(Q, K, V, A, dZ, scale, dQ, dK, dV):
    """:func:`_attention_rows_backward` over whole arrays."""
    dA = dZ @ V.swapaxes(-1, -2)                                    # (B, H, Tq, Tk)
    dV[...] = A.swapaxes(-1, -2) @ dZ
    dS = A * (dA - (A * dA).sum(axis=-1, keepdims=True)) / scale
    dQ[...] = dS @ K
    dK[...] = dS.swapaxes(-1, -2) @ Q


# ----------------------------------------------------------------------------------------------
# multi-head attention (self or cross)
# ----------------------------------------------------------------------------------------------
def project_kv(x_kv: np.ndarray, p: dict, n_heads: int):
    """Keys and values of a sequence, split into heads: ``K, V`` each ``(B, H, Tk, d_k)``."""
    K = split_heads(linear(x_kv, p["W_K"], p["b_K"]), n_heads)
    V = split_heads(linear(x_kv, p["W_V"], p["b_V"]), n_heads)
    return K, V


def attend(x_q: np.ndarray, K: np.ndarray, V: np.ndarray, p: dict, n_heads: int, mask=None):
    r"""Multi-head attention of the queries of ``x_q`` over given keys and values.

    .. math:: Q = x_q W_Q + b_Q, \quad A_h = \mathrm{softmax}(Q_h K_h^\top / \sqrt{d_k} + M),
              \quad \mathrm{out} = \mathrm{Concat}_h(A_h V_h)\, W_O + b_O

    Parameters
    ----------
    x_q : (B, Tq, d)
    K, V : (B, H, Tk, d_k), from :func:`project_kv` (or a KV cache)
    p : dict with ``W_Q, W_O, b_Q, b_O`` (and ``W_K, W_V, b_K, b_V`` for the backward pass)
    mask : additive mask (Tq, Tk), shared by every sequence and head, or None

    Returns
    -------
    output : (B, Tq, d)
    cache : dict with ``scores`` and ``weights`` (B, H, Tq, Tk), ``head_outputs`` (B, H, Tq, d_k),
        ``concat`` (B, Tq, d), ``output``, and the inputs the backward pass needs.
    """
    B, H, Tk, d_k = K.shape
    # 1. queries, split into heads
    Q = np.ascontiguousarray(split_heads(linear(x_q, p["W_Q"], p["b_Q"]), n_heads))   # (B, H, Tq, d_k)
    Tq = Q.shape[2]
    # 2-4. scaled, masked scores; each row's softmax; each head's weighted average of the values
    scores = np.empty((B, H, Tq, Tk), dtype=Q.dtype)
    A = np.empty_like(scores)
    Z = np.empty((B, H, Tq, d_k), dtype=Q.dtype)
    no_mask = np.zeros((Tq, Tk), dtype=Q.dtype) if mask is None else mask
    compiled_or(_attention_rows, _attention_rows_numpy, Q, np.ascontiguousarray(K), np.ascontiguousarray(V),
                no_mask, math.sqrt(d_k), scores, A, Z)
    concat = merge_heads(Z)                                         # (B, Tq, H*d_k)
    # 5. output projection
    out = linear(concat, p["W_O"], p["b_O"])                        # (B, Tq, d)
    cache = {"x_q": x_q, "Q": Q, "K": K, "V": V, "scores": scores, "weights": A,
             "head_outputs": Z, "concat": concat, "output": out}
    return out, cache


def attention(x_q: np.ndarray, x_kv: np.ndarray, p: dict, n_heads: int, mask=None):
    """Multi-head attention of ``x_q`` over ``x_kv`` (the same array for self-attention);
    see :func:`attend` for the formula and the cache."""
    K, V = project_kv(x_kv, p, n_heads)
    out, cache = attend(x_q, K, V, p, n_heads, mask)
    cache["x_kv"] = x_kv
    return out, cache


def attention_backward(d_out: np.ndarray, cache: dict, p: dict):
    """Backward pass of :func:`attention`, step by step in reverse.

    Returns
    -------
    dx_q : (B, Tq, d)
    dx_kv : (B, Tk, d); for self-attention add it to ``dx_q``
    grads : dict of ``W_Q ... b_O``
    """
    n_heads = cache["Q"].shape[1]
    d_k = cache["Q"].shape[-1]
    A, Q, K, V = cache["weights"], cache["Q"], cache["K"], cache["V"]
    g = {}
    # 5. output projection
    d_concat, g["W_O"], g["b_O"] = linear_backward(d_out, cache["concat"], p["W_O"])
    # 4-2. back into heads, through Z = A V, the softmax and the scaled scores
    dZ = np.ascontiguousarray(split_heads(d_concat, n_heads))       # (B, H, Tq, d_k)
    K, V = np.ascontiguousarray(K), np.ascontiguousarray(V)
    dQ, dK, dV = np.empty_like(dZ), np.empty_like(K), np.empty_like(V)
    compiled_or(_attention_rows_backward, _attention_rows_backward_numpy, Q, K, V, A, dZ, math.sqrt(d_k), dQ, dK, dV)
    # 1. projections
    dx_q, g["W_Q"], g["b_Q"] = linear_backward(merge_heads(dQ), cache["x_q"], p["W_Q"])
    dx_k, g["W_K"], g["b_K"] = linear_backward(merge_heads(dK), cache["x_kv"], p["W_K"])
    dx_v, g["W_V"], g["b_V"] = linear_backward(merge_heads(dV), cache["x_kv"], p["W_V"])
    return dx_q, dx_k + dx_v, g
