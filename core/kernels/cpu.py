"""Lesson kernels for the CPU: one small ``@njit`` loop nest per step of attention.

Each kernel is the formula of ``core/kernels/reference.py`` (the plain NumPy oracle the tests compare
against) written out as loops, so that a reader who knows NumPy can follow every multiply-add:

    S = Q K^T * scale          scores_kernel
    S = S + M                  add_mask_kernel      (M additive: 0 may look, -inf may not)
    A = softmax(S) by rows     softmax_kernel       (a row with nothing allowed gives zeros)
    out = A V                  weighted_sum_kernel
    all four, one call         attention_steps      (S and A kept: the pages draw both)
    out without building A     fused_attention_kernel  (online softmax, one key at a time)
    X W + b, split into heads  project_heads_kernel
    Concat(heads) W_O + b_O    merge_heads_project_kernel
    PE[p, 2i], PE[p, 2i+1]     sinusoidal_kernel

``core/kernels/gpu.py`` has kernels of the same names for CUDA. Below the kernels, the host drivers
(``scaled_scores``, ``attention_with_weights``, ...) allocate the outputs and run the kernels. They
take validated, C-contiguous arrays of one float dtype:

- ``Q (B, H, Tq, d_k)``, ``K (B, H, Tk, d_k)``, ``V (B, H, Tk, d_v)``;
- ``mask (Bm, Hm, Tqm, Tkm)``, additive, each axis either 1 (broadcast) or full size, never None;
- biases are arrays (zeros for "no bias"), never None.

The loops are serial: at the lesson's sizes (T <= 64, d <= 64) they take microseconds, and a
serial loop compiles in a fraction of the time a parallel one does. No ``fastmath``: the masks
rely on ``-inf`` arithmetic (``exp(-inf) = 0``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


# --- kernels -------------------------------------------------------------------------------
# Sums start from 0.0, a float64 in Numba: float32 data is summed in float64, stored as float32.


@njit(cache=True)
def scores_kernel(Q, K, scale, S):
    """``S = Q K^T * scale``: ``S[b, h, i, j] = (q_i . k_j) * scale``, how well key j matches query i.

    Q (B, H, Tq, d_k), K (B, H, Tk, d_k) -> S (B, H, Tq, Tk).
    """
    B, H, Tq, Tk = S.shape
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                for j in range(Tk):
                    total = 0.0
                    for c in range(Q.shape[3]):            # q_i . k_j
                        total += Q[b, h, i, c] * K[b, h, j, c]
                    S[b, h, i, j] = total * scale


@njit(cache=True)
def add_mask_kernel(S, M):
    """``S = S + M`` in place: 0 leaves a score as it is, -inf forbids query i to look at key j.

    S (B, H, Tq, Tk); M (Bm, Hm, Tqm, Tkm), each axis 1 or full size: an axis of size 1
    broadcasts (NumPy's rule), as ``min(b, Bm - 1) = 0`` picks its one entry for every b.
    """
    B, H, Tq, Tk = S.shape
    Bm, Hm, Tqm, Tkm = M.shape
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                for j in range(Tk):
                    S[b, h, i, j] += M[min(b, Bm - 1), min(h, Hm - 1), min(i, Tqm - 1), min(j, Tkm - 1)]


@njit(cache=True)
def softmax_kernel(S, A):
    """``A = softmax(S)`` over each row's keys: every row of A sums to 1, or is all 0 when the row
    has nothing allowed (all -inf). S (B, H, Tq, Tk) -> A (B, H, Tq, Tk)."""
    B, H, Tq, Tk = S.shape
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                s, a = S[b, h, i], A[b, h, i]            # one row of scores, one of weights: (Tk,)
                # 1. the row's maximum, subtracted before exp so that no exp overflows
                m = s[0]
                for j in range(1, Tk):
                    m = max(m, s[j])
                if m == -math.inf:                     # nothing allowed: zeros, not 0 / 0 = NaN
                    for j in range(Tk):
                        a[j] = 0
                    continue
                # 2. exponentiate (a masked score, -inf, becomes exactly 0) and sum
                total = 0.0
                for j in range(Tk):
                    a[j] = math.exp(s[j] - m)
                    total += a[j]
                # 3. normalise, so that the row sums to 1
                for j in range(Tk):
                    a[j] /= total


@njit(cache=True)
def weighted_sum_kernel(A, V, out):
    """``out = A V``: output row i is the mix of value rows weighted by row i of A.

    A (B, H, Tq, Tk), V (B, H, Tk, d_v) -> out (B, H, Tq, d_v).
    """
    B, H, Tq, d_v = out.shape
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                for c in range(d_v):
                    total = 0.0
                    for j in range(A.shape[3]):            # row i of A . column c of V
                        total += A[b, h, i, j] * V[b, h, j, c]
                    out[b, h, i, c] = total


@njit(cache=True)
def fused_attention_kernel(Q, K, V, M, scale, out):
    """``out = softmax(Q K^T * scale + M) V`` without building the (Tq, Tk) matrix: online softmax,
    one key at a time, keeping a running max ``m``, sum ``l = sum_j exp(s_j - m)`` and output
    ``acc = sum_j exp(s_j - m) v_j``; then ``out = acc / l``. Shapes as in the kernels above."""
    B, H, Tq, d_v = out.shape
    Bm, Hm, Tqm, Tkm = M.shape                         # broadcast as in add_mask_kernel
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                acc = out[b, h, i]                     # (d_v,): the output row, summed in place
                for c in range(d_v):
                    acc[c] = 0
                m, l = -math.inf, 0.0                  # nothing seen yet
                for j in range(K.shape[2]):
                    # 1. this key's score; a masked key (-inf) adds nothing
                    s = 0.0
                    for c in range(Q.shape[3]):
                        s += Q[b, h, i, c] * K[b, h, j, c]
                    s = s * scale + M[min(b, Bm - 1), min(h, Hm - 1), min(i, Tqm - 1), min(j, Tkm - 1)]
                    if s == -math.inf:
                        continue
                    # 2. a new maximum: rescale what was summed so far (by 0 on the first key)
                    if s > m:
                        alpha = math.exp(m - s)
                        l *= alpha
                        for c in range(d_v):
                            acc[c] *= alpha
                        m = s
                    # 3. add this key: weight exp(s - m), value row v_j
                    p = math.exp(s - m)
                    l += p
                    for c in range(d_v):
                        acc[c] += p * V[b, h, j, c]
                # 4. normalise once; a row with nothing allowed has l = 0 and keeps its zeros
                if l > 0:
                    for c in range(d_v):
                        acc[c] /= l


@njit(cache=True)
def project_heads_kernel(X, W, bias, out):
    """``X W + b`` split into heads: column ``h*d + c`` of the product is feature c of head h.

    X (B, T, d_in), W (d_in, H*d), bias (H*d,) -> out (B, H, T, d).
    """
    B, H, T, d = out.shape
    for b in range(B):
        for h in range(H):
            for t in range(T):
                for c in range(d):
                    col = h * d + c                    # head h owns columns h*d .. h*d + d - 1
                    total = bias[col]
                    for k in range(X.shape[2]):
                        total += X[b, t, k] * W[k, col]
                    out[b, h, t, c] = total


@njit(cache=True)
def merge_heads_project_kernel(O, W_O, bias, out):
    """``Concat(O_1, ..., O_H) W_O + b_O``, read straight from the heads (no concat is built).

    Head h's output meets its own row block ``W_O[h*d_v : (h+1)*d_v]``, its synthesis filter.
    O (B, H, T, d_v), W_O (H*d_v, d_out), bias (d_out,) -> out (B, T, d_out).
    """
    B, H, T, d_v = O.shape
    d_out = out.shape[2]
    for b in range(B):
        for t in range(T):
            for c in range(d_out):
                total = bias[c]
                for h in range(H):
                    for k in range(d_v):             # row block h of W_O: rows h*d_v .. h*d_v + d_v - 1
                        total += O[b, h, t, k] * W_O[h * d_v + k, c]
                out[b, t, c] = total


@njit(cache=True)
def sinusoidal_kernel(base, PE):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))``.

    PE (T, d_model); column pair (2i, 2i+1) turns at one frequency, slower as i grows.
    """
    T, d_model = PE.shape
    for p in range(T):
        for c in range(d_model):
            two_i = c - c % 2                          # both columns of a pair share one angle
            angle = p / base ** (two_i / d_model)
            PE[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)


@njit(cache=True)
def attention_steps(Q, K, V, M, scale):
    """The four kernels of attention one after another, in one call from Python (each call from
    Python costs about a microsecond, as much as a kernel's loops at the lesson's size).

    Q (B, H, Tq, d_k), K (B, H, Tk, d_k), V (B, H, Tk, d_v) -> out (B, H, Tq, d_v), A (B, H, Tq, Tk)
    and the scores S (B, H, Tq, Tk) A is the softmax of, masked.
    """
    B, H, Tq, _ = Q.shape
    S = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    A = np.empty_like(S)
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    scores_kernel(Q, K, scale, S)                    # S = Q K^T * scale
    add_mask_kernel(S, M)                            # S = S + M
    softmax_kernel(S, A)                             # A = softmax(S), row by row
    weighted_sum_kernel(A, V, out)                   # out = A V
    return out, A, S


# --- host drivers ------------------------------------------------------------------------------


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` -> (B, H, Tq, Tk)."""
    B, H, Tq, _ = Q.shape
    S = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    scores_kernel(Q, K, float(scale), S)            # a float64, like the sums (see the kernels)
    add_mask_kernel(S, mask)
    return S


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` and ``out = A V`` -> (out (B, H, Tq, d_v), A (B, H, Tq, Tk))."""
    out, A, _ = attention_steps(Q, K, V, mask, float(scale))
    return out, A


def attention_with_scores(Q, K, V, mask, scale):
    """:func:`attention_with_weights`, and the scores ``S = Q K^T * scale + M`` it took the softmax of
    -> (out (B, H, Tq, d_v), A (B, H, Tq, Tk), S (B, H, Tq, Tk))."""
    return attention_steps(Q, K, V, mask, float(scale))


def weighted_sum(A, V):
    """``out = A V`` -> (B, H, Tq, d_v)."""
    out = np.empty(A.shape[:3] + (V.shape[3],), dtype=V.dtype)
    weighted_sum_kernel(A, V, out)
    return out


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + M) V`` without materialising the (Tq, Tk) weights -> (B, H, Tq, d_v)."""
    B, H, Tq, _ = Q.shape
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    fused_attention_kernel(Q, K, V, mask, float(scale), out)
    return out


def project_heads(X, W, b, n_heads):
    """``X W + b`` split into heads: X (B, T, d_in), W (d_in, H*d), b (H*d,) -> (B, H, T, d)."""
    B, T, _ = X.shape
    out = np.empty((B, n_heads, T, W.shape[1] // n_heads), dtype=X.dtype)
    project_heads_kernel(X, W, b, out)
    return out


def merge_heads_project(O, W_O, b_O):
    """``Concat(O_1..O_H) W_O + b_O``: O (B, H, T, d_v) -> (B, T, d_out)."""
    B, _, T, _ = O.shape
    out = np.empty((B, T, W_O.shape[1]), dtype=O.dtype)
    merge_heads_project_kernel(O, W_O, b_O, out)
    return out


def sinusoidal(T, d_model, base, dtype):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))`` -> (T, d_model)."""
    PE = np.empty((T, d_model), dtype=dtype)
    sinusoidal_kernel(float(base), PE)               # angles in float64, rounded once at the store
    return PE
