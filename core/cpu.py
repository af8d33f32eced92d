"""Numba CPU kernels (``@njit``) for attention, masking, multi-head projection and positional encoding.

Host drivers here and in ``core/gpu.py`` share names and signatures; ``core/attention.py`` picks one.
Drivers take validated, C-contiguous arrays of one float dtype and return new arrays:

- ``Q (B, H, Tq, d_k)``, ``K (B, H, Tk, d_k)``, ``V (B, H, Tk, d_v)``;
- ``mask (Bm, Hm, Tqm, Tkm)``, additive, each axis either 1 (broadcast) or full size, never None;
- biases are arrays (zeros for "no bias"), never None.

Every kernel is compiled twice from one row function: a serial loop for the small shapes of the
lesson pages (a parallel region costs microseconds to start) and a ``prange`` loop for big ones.
"""
from __future__ import annotations

import math
import types

import numpy as np
from numba import njit, prange
from numba.extending import overload

from core.fastexp import fast_exp
from core.floatbits import max_abs_bits, max_of
from core.validate import mask_values_ok

# Reassociation lets LLVM vectorise the dot products; no flag here touches inf/NaN semantics,
# which the -inf masks rely on (so no 'nnan', 'ninf' or plain fastmath=True).
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
# Below this many multiply-adds a call runs serially (tunable, and patched by tests).
PARALLEL_MIN_WORK = 1 << 16
# Queries handled together by one parallel work unit (16 to 128 measured alike: keys and values
# are transposed once per head, not per unit), and keys per tile in the fused kernel (512 ran
# 1.3-1.6x faster than 128 at T >= 512: fewer rescales, longer dot products per weighted sum).
QUERY_BLOCK = 32
KEY_TILE = 512

_jit = dict(cache=True, fastmath=FASTMATH)
# Small helpers are inlined into the kernels (inline="always"); the big row functions (scores,
# softmax, weighted sums) are ordinary compiled functions the kernels call: compiled once and
# cached, instead of once per kernel and build, which cut compile time about 4x at the same speed.


# --- device-side helpers -----------------------------------------------------------------


@njit(inline="always", **_jit)
def _mask_row(mask, b, h, i):
    """The mask's row for query (b, h, i), honouring broadcast axes of length 1: (1,) or (Tk,)."""
    return mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0, i if mask.shape[2] > 1 else 0]


@njit(inline="always", **_jit)
def _heads_transposed(X):
    """``X`` (B, H, Tk, d) as (B, H, d, Tk): keys (or values) along the fast axis, so the loops
    over keys run several keys at once in SIMD lanes.

    Done once per head, before the work is split into blocks of queries (each block transposing
    for itself cost as much as its arithmetic), and row by row of the result (contiguous stores,
    strided loads): 2-4x faster than key by key, whose stores, a power of two bytes apart, all fell
    into the same few cache sets.
    """
    B, H, Tk, d = X.shape
    Xt = np.empty((B, H, d, Tk), dtype=X.dtype)
    for u in prange(B * H):
        b, h = u // H, u % H
        for c in range(d):
            row = Xt[b, h, c]
            for j in range(Tk):
                row[j] = X[b, h, j, c]
    return Xt


@njit(inline="always", **_jit)
def _fill(x, lo, hi, value):
    """``x[lo:hi] = value`` as a plain loop (a slice assignment costs ~20 ns of setup, which
    dominates at the lesson pages' six-token rows)."""
    y = x[lo:hi]                               # zero-based, so the loop vectorises (see _scores_into)
    for j in range(hi - lo):
        y[j] = value


@njit(inline="always", **_jit)
def _live_keys(m, j0, n):
    """``[lo, hi)``: the keys of a tile (``j0 .. j0+n``) outside which the mask row ``m`` is all -inf.

    A causal or padding mask leaves a contiguous run of live keys: scores, exps and the weighted
    sum only visit that run, which halves the work of causal attention.
    """
    if m.shape[0] == 1:                        # mask broadcast along keys
        return (0, n) if m[0] != -np.inf else (0, 0)
    # A whole pass with integer min/max (which LLVM vectorises) instead of scanning in from both
    # ends: a causal row's scan from the end stopped only after half the row, one key at a time.
    row, lo, hi = m[j0:j0 + n], n, 0
    for j in range(n):
        live = row[j] != -np.inf
        lo = min(lo, j if live else n)
        hi = max(hi, j + 1 if live else 0)
    return (lo, hi) if lo < hi else (0, 0)


@njit(**_jit)
def _scores_into(Q, Kt, mask, scale, b, h, i, j0, n, out):
    """``out[j] = Q[b,h,i] . K[b,h,j0+j] * scale + M[b,h,i,j0+j]`` for ``j < n`` (a tile of keys from
    ``j0``), where ``Kt[:, j]`` holds key ``j``; returns the live range ``[lo, hi)`` (``out`` is -inf
    outside it)."""
    m = _mask_row(mask, b, h, i)
    lo, hi = _live_keys(m, j0, n)
    a, z = j0 + lo, j0 + hi               # the live keys' columns in Kt
    q = Q[b, h, i]
    # Loops start at 0 over slices: LLVM then knows no index is negative (Numba's wraparound for
    # negative indices would otherwise stop the vectoriser).
    live = out[lo:hi]
    _fill(live, 0, hi - lo, 0.0)
    # Four rows of Kt per pass over the keys: each score is loaded and stored once per four
    # multiply-adds instead of once per one (stores, not arithmetic, bound the one-row loop).
    dk, d = q.shape[0], 0
    while d + 4 <= dk:
        q0, q1, q2, q3 = q[d] * scale, q[d + 1] * scale, q[d + 2] * scale, q[d + 3] * scale
        k0, k1, k2, k3 = Kt[d, a:z], Kt[d + 1, a:z], Kt[d + 2, a:z], Kt[d + 3, a:z]
        for j in range(hi - lo):
            live[j] += q0 * k0[j] + q1 * k1[j] + q2 * k2[j] + q3 * k3[j]
        d += 4
    for d in range(d, dk):
        qd, kd = q[d] * scale, Kt[d, a:z]
        for j in range(hi - lo):
            live[j] += qd * kd[j]
    _add_mask(live, m, j0 + lo)
    _fill(out, 0, lo, -np.inf)
    _fill(out, hi, n, -np.inf)
    return lo, hi


@njit(inline="always", **_jit)
def _add_mask(live, m, j):
    """``live += m[j:j+len(live)]`` (or ``+= m[0]`` for a mask broadcast along keys, skipped when
    it is 0: the scores arrive already scaled, the scale folded into the query)."""
    if m.shape[0] > 1:
        mj = m[j:j + live.shape[0]]
        for k in range(live.shape[0]):
            live[k] += mj[k]
    elif m[0] != 0.0:
        for k in range(live.shape[0]):
            live[k] += m[0]


@njit(**_jit)
def _scores_quad_into(Q, Kt, mask, scale, b, h, i, j0, n, s0, s1, s2, s3):
    """:func:`_scores_into` for queries ``i .. i+3`` at once (keys ``j0 .. j0+n``).

    A register tile of 4 queries x 4 features per pass over the keys: each row of Kt loaded serves
    four queries, and each score is loaded and stored once per 16 multiply-adds (about 1.5x the
    speed of two queries at a time). All four rows cover the union of their live ranges, which is
    returned (masked keys inside it get -inf from the mask anyway); outside it the rows are left
    as they were, since every caller reads only the live range.
    """
    lo, hi = n, 0
    for r in range(4):
        a, c = _live_keys(_mask_row(mask, b, h, i + r), j0, n)
        if a < c:
            lo, hi = min(lo, a), max(hi, c)
    if lo > hi:
        lo, hi = 0, 0                      # nothing live for any of the four
    a, z = j0 + lo, j0 + hi               # the live keys' columns in Kt
    q0, q1, q2, q3 = Q[b, h, i], Q[b, h, i + 1], Q[b, h, i + 2], Q[b, h, i + 3]
    l0, l1, l2, l3 = s0[lo:hi], s1[lo:hi], s2[lo:hi], s3[lo:hi]   # zero-based slices, as in _scores_into
    for live in (l0, l1, l2, l3):
        _fill(live, 0, hi - lo, 0.0)
    dk, d = q0.shape[0], 0
    while d + 4 <= dk:
        k0, k1, k2, k3 = Kt[d, a:z], Kt[d + 1, a:z], Kt[d + 2, a:z], Kt[d + 3, a:z]
        a0, a1, a2, a3 = q0[d] * scale, q0[d + 1] * scale, q0[d + 2] * scale, q0[d + 3] * scale
        b0, b1, b2, b3 = q1[d] * scale, q1[d + 1] * scale, q1[d + 2] * scale, q1[d + 3] * scale
        c0, c1, c2, c3 = q2[d] * scale, q2[d + 1] * scale, q2[d + 2] * scale, q2[d + 3] * scale
        e0, e1, e2, e3 = q3[d] * scale, q3[d + 1] * scale, q3[d + 2] * scale, q3[d + 3] * scale
        for j in range(hi - lo):
            x0, x1, x2, x3 = k0[j], k1[j], k2[j], k3[j]
            l0[j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
            l1[j] += b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
            l2[j] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
            l3[j] += e0 * x0 + e1 * x1 + e2 * x2 + e3 * x3
        d += 4
    for d in range(d, dk):
        kd, w0, w1, w2, w3 = Kt[d, a:z], q0[d] * scale, q1[d] * scale, q2[d] * scale, q3[d] * scale
        for j in range(hi - lo):
            x = kd[j]
            l0[j] += w0 * x
            l1[j] += w1 * x
            l2[j] += w2 * x
            l3[j] += w3 * x
    for r, live in enumerate((l0, l1, l2, l3)):
        _add_mask(live, _mask_row(mask, b, h, i + r), j0 + lo)
    return lo, hi


@njit(**_jit)
def _softmax_inplace(row):
    """Stable softmax of one row; a row with nothing allowed (all -inf) becomes all zeros.

    Accumulators stay in the row's dtype (a float64 ``total`` would turn every float32 exp into a
    float64 one), and ``fast_exp`` is the vectorisable polynomial for float32, exact 0 at -inf.
    """
    if row.shape[0] == 0:
        return
    m = max_of(row, row[0])
    if m == -np.inf:
        _fill(row, 0, row.shape[0], 0.0)
        return
    total = row.dtype.type(0)
    for j in range(row.shape[0]):
        e = fast_exp(row[j] - m)
        row[j] = e
        total += e
    inv = row.dtype.type(1) / total
    for j in range(row.shape[0]):
        row[j] *= inv


@njit(**_jit)
def _weighted_sum_quad(p0, p1, p2, p3, Vt, j0, lo, hi, o0, o1, o2, o3):
    """``o_r += sum_{lo <= j < hi} p_r[j] V[j0 + j]`` for four rows of weights ``p_r`` over a tile of
    keys from ``j0``, where ``Vt[:, j]`` holds value row ``j``.

    A register tile of 4 rows x 4 value features, each entry a dot product over the keys: LLVM
    keeps the 16 running sums in vector registers for the whole pass (nothing is stored until the
    end), which runs at 2-3x the speed of adding weighted value rows into the output row by row.
    """
    w0, w1, w2, w3 = p0[lo:hi], p1[lo:hi], p2[lo:hi], p3[lo:hi]   # zero-based slices (see _scores_into)
    a, z = j0 + lo, j0 + hi               # the live keys' columns in Vt
    zero = p0.dtype.type(0)
    dv, c = Vt.shape[0], 0
    while c + 4 <= dv:
        v0, v1, v2, v3 = Vt[c, a:z], Vt[c + 1, a:z], Vt[c + 2, a:z], Vt[c + 3, a:z]
        s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
        s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
        for j in range(hi - lo):
            x0, x1, x2, x3 = v0[j], v1[j], v2[j], v3[j]
            y0, y1, y2, y3 = w0[j], w1[j], w2[j], w3[j]
            s00 += y0 * x0; s01 += y0 * x1; s02 += y0 * x2; s03 += y0 * x3  # noqa: E702
            s10 += y1 * x0; s11 += y1 * x1; s12 += y1 * x2; s13 += y1 * x3  # noqa: E702
            s20 += y2 * x0; s21 += y2 * x1; s22 += y2 * x2; s23 += y2 * x3  # noqa: E702
            s30 += y3 * x0; s31 += y3 * x1; s32 += y3 * x2; s33 += y3 * x3  # noqa: E702
        o0[c] += s00; o0[c + 1] += s01; o0[c + 2] += s02; o0[c + 3] += s03  # noqa: E702
        o1[c] += s10; o1[c + 1] += s11; o1[c + 2] += s12; o1[c + 3] += s13  # noqa: E702
        o2[c] += s20; o2[c + 1] += s21; o2[c + 2] += s22; o2[c + 3] += s23  # noqa: E702
        o3[c] += s30; o3[c + 1] += s31; o3[c + 2] += s32; o3[c + 3] += s33  # noqa: E702
        c += 4
    for c in range(c, dv):
        v = Vt[c, a:z]
        t0 = t1 = t2 = t3 = zero
        for j in range(hi - lo):
            x = v[j]
            t0 += w0[j] * x
            t1 += w1[j] * x
            t2 += w2[j] * x
            t3 += w3[j] * x
        o0[c] += t0
        o1[c] += t1
        o2[c] += t2
        o3[c] += t3


@njit(**_jit)
def _weighted_sum_one(p, Vt, j0, lo, hi, o):
    """:func:`_weighted_sum_quad` for a single row of weights (the rows left over after quads)."""
    w = p[lo:hi]
    for c in range(Vt.shape[0]):
        v, t = Vt[c, j0 + lo:j0 + hi], p.dtype.type(0)
        for j in range(hi - lo):
            t += w[j] * v[j]
        o[c] += t


@njit(inline="always", **_jit)
def _weighted_sum_at(A, Vt, b, h, i, n_rows, lo, hi, out):
    """``out[b,h,r] = A[b,h,r] V`` for rows ``r = i .. i+n_rows-1`` (``n_rows`` 4 or 1), summing
    over the keys ``[lo, hi)`` only (the weights are 0 outside them)."""
    for r in range(i, i + n_rows):
        _fill(out[b, h, r], 0, out.shape[3], 0.0)
    if n_rows == 4:
        _weighted_sum_quad(A[b, h, i], A[b, h, i + 1], A[b, h, i + 2], A[b, h, i + 3], Vt, 0, lo, hi,
                           out[b, h, i], out[b, h, i + 1], out[b, h, i + 2], out[b, h, i + 3])
    else:
        _weighted_sum_one(A[b, h, i], Vt, 0, lo, hi, out[b, h, i])


@njit(inline="always", **_jit)
def _unit(u, H, n_blocks, Tq, block):
    """Work unit ``u`` -> (batch, head, first query, end query): one block of queries of one head."""
    b, h, qb = u // (H * n_blocks), (u // n_blocks) % H, u % n_blocks
    return b, h, qb * block, min(qb * block + block, Tq)


# --- kernels: one function per operation, serial and parallel builds ----------------------
# The parallel loop runs over (batch, head, block of queries), after one pass has transposed every
# head's keys (and values) for the loops over keys.


def _scores_rows(Q, K, mask, scale, S, block):
    B, H, Tq, Tk = S.shape
    n_blocks = (Tq + block - 1) // block
    Kt = _heads_transposed(K)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        for i in range(i0, i1):
            _scores_into(Q, Kt[b, h], mask, scale, b, h, i, 0, Tk, S[b, h, i])


def _softmax_rows(S, A):
    B, H, Tq, Tk = S.shape
    for r in prange(B * H * Tq):
        b, h, i = r // (H * Tq), (r // Tq) % H, r % Tq
        A[b, h, i] = S[b, h, i]
        _softmax_inplace(A[b, h, i])


@njit(inline="always", **_jit)
def _softmax_live(row, lo, hi):
    """Softmax over the live keys ``[lo, hi)``; the weights are exactly 0 outside them."""
    _softmax_inplace(row[lo:hi])
    _fill(row, 0, lo, 0.0)
    _fill(row, hi, row.shape[0], 0.0)


@njit(inline="always", **_jit)
def _weights_block(Q, Kt, Vt, mask, scale, b, h, i0, i1, A, out, with_output):
    """Rows ``i0..i1`` of ``A = softmax(Q K^T * scale + M)`` (queries four at a time, see
    :func:`_scores_quad_into`; one at a time for the rest), and ``out = A V`` for them when
    ``with_output``."""
    Tk = A.shape[3]
    i = i0
    while i < i1:
        n_rows = 4 if i + 4 <= i1 else 1
        if n_rows == 4:
            lo, hi = _scores_quad_into(Q, Kt, mask, scale, b, h, i, 0, Tk,
                                       A[b, h, i], A[b, h, i + 1], A[b, h, i + 2], A[b, h, i + 3])
        else:
            lo, hi = _scores_into(Q, Kt, mask, scale, b, h, i, 0, Tk, A[b, h, i])
        for r in range(i, i + n_rows):
            _softmax_live(A[b, h, r], lo, hi)
        if with_output:
            _weighted_sum_at(A, Vt, b, h, i, n_rows, lo, hi, out)
        i += n_rows


def _weights_rows(Q, K, mask, scale, A, block):
    B, H, Tq = A.shape[0], A.shape[1], A.shape[2]
    n_blocks = (Tq + block - 1) // block
    Kt = _heads_transposed(K)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        _weights_block(Q, Kt[b, h], Kt[b, h], mask, scale, b, h, i0, i1, A, A, False)


def _attention_rows(Q, K, V, mask, scale, A, out, block):
    B, H, Tq = A.shape[0], A.shape[1], A.shape[2]
    n_blocks = (Tq + block - 1) // block
    Kt, Vt = _heads_transposed(K), _heads_transposed(V)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        _weights_block(Q, Kt[b, h], Vt[b, h], mask, scale, b, h, i0, i1, A, out, True)


def _weighted_sum_rows(A, V, out, block):
    B, H, Tq, Tk = A.shape
    n_blocks = (Tq + block - 1) // block
    Vt = _heads_transposed(V)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        i = i0
        while i < i1:
            n_rows = 4 if i + 4 <= i1 else 1
            _weighted_sum_at(A, Vt[b, h], b, h, i, n_rows, 0, Tk, out)
            i += n_rows


@njit(**_jit)
def _online_rescale(s, lo, hi, r, m, l, acc):
    """Turn one tile's scores ``s[lo:hi]`` of query ``r`` into ``exp(score - m)`` for its running max
    ``m[r]``, raising that max (and rescaling the normaliser ``l[r]`` and the unnormalised output
    ``acc[r]`` by ``exp(m_old - m_new)``) when the tile holds a larger score. A query with nothing
    live so far gets zeros, so the weighted sum that follows adds nothing for it."""
    live = s[lo:hi]                           # zero-based, so the loops vectorise (see _scores_into)
    m_new = max_of(live, m[r])
    if m_new == -np.inf:
        _fill(live, 0, hi - lo, 0.0)
        return
    if m_new > m[r]:
        correction = fast_exp(m[r] - m_new)   # exp(-inf) = 0 on the first live tile
        l[r] *= correction
        for d in range(acc.shape[1]):
            acc[r, d] *= correction
        m[r] = m_new
    tile_sum = l.dtype.type(0)
    for j in range(hi - lo):
        p = fast_exp(live[j] - m_new)         # exactly 0 for masked keys
        live[j] = p
        tile_sum += p
    l[r] += tile_sum


def _fused_blocks(Q, K, V, mask, scale, out, block, key_tile):
    """Online softmax over key tiles, FlashAttention-style: per query keep the running max ``m``,
    the running normaliser ``l`` and the unnormalised output ``acc``; rescale both by
    ``exp(m_old - m_new)`` when a tile raises the max. Extra memory: the transposed keys and values
    (the size of K and V) and, per unit, O(key_tile + block * d_v); never (Tq, Tk)."""
    B, H, Tq, Tk, dv = Q.shape[0], Q.shape[1], Q.shape[2], K.shape[2], V.shape[3]
    n_blocks = (Tq + block - 1) // block
    Kt, Vt = _heads_transposed(K), _heads_transposed(V)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        s = np.empty((4, key_tile), dtype=Q.dtype)     # scores, then exps, of four queries against a tile
        m = np.full(i1 - i0, -np.inf, dtype=Q.dtype)   # running max per query
        l = np.zeros(i1 - i0, dtype=Q.dtype)           # running sum of exp(score - m)
        acc = np.zeros((i1 - i0, dv), dtype=Q.dtype)   # running sum of exp(score - m) * v
        for j0 in range(0, Tk, key_tile):
            j1 = min(j0 + key_tile, Tk)
            i = i0
            while i < i1:
                r = i - i0
                if i + 4 <= i1:
                    lo, hi = _scores_quad_into(Q, Kt[b, h], mask, scale, b, h, i, j0, j1 - j0,
                                               s[0], s[1], s[2], s[3])
                    for k in range(4):
                        _online_rescale(s[k], lo, hi, r + k, m, l, acc)
                    _weighted_sum_quad(s[0], s[1], s[2], s[3], Vt[b, h], j0, lo, hi,
                                       acc[r], acc[r + 1], acc[r + 2], acc[r + 3])
                    i += 4
                else:
                    lo, hi = _scores_into(Q, Kt[b, h], mask, scale, b, h, i, j0, j1 - j0, s[0])
                    _online_rescale(s[0], lo, hi, r, m, l, acc)
                    _weighted_sum_one(s[0], Vt[b, h], j0, lo, hi, acc[r])
                    i += 1
        for i in range(i0, i1):
            r = i - i0
            inv = 1.0 / l[r] if l[r] > 0.0 else 0.0  # nothing allowed: zeros, never NaN
            for d in range(dv):
                out[b, h, i, d] = acc[r, d] * inv


def _project_rows(X, W, bias, out):
    """``(X W + b)`` stored head-split: column ``c`` goes to head ``c // d``, feature ``c % d``."""
    B, T, d_in = X.shape
    H, d = out.shape[1], out.shape[3]
    for r in prange(B * T):
        b, t = r // T, r % T
        for c in range(H * d):
            out[b, c // d, t, c % d] = bias[c]
        for k in range(d_in):
            x = X[b, t, k]
            if x != 0.0:
                for c in range(H * d):
                    out[b, c // d, t, c % d] += x * W[k, c]


def _merge_project_rows(O, W_O, bias, out):
    """``Concat(O) W_O + b``, reading head ``h``'s row block of ``W_O`` directly (no concat copy)."""
    B, H, T, dv = O.shape
    for r in prange(B * T):
        b, t = r // T, r % T
        for c in range(out.shape[2]):
            out[b, t, c] = bias[c]
        for h in range(H):
            for k in range(dv):
                x = O[b, h, t, k]
                if x != 0.0:
                    for c in range(out.shape[2]):
                        out[b, t, c] += x * W_O[h * dv + k, c]


def _sinusoid_rows(base, PE):
    T, d_model = PE.shape
    for p in prange(T):
        for c in range(d_model):
            two_i = c - (c % 2)
            angle = p / base ** (two_i / d_model)
            PE[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)


def _build(fn):
    """(serial, parallel) builds of one kernel body, both cached on disk.

    Numba's cache key ignores compile options, so the parallel build compiles a renamed twin of
    ``fn``: otherwise one build could load the other's machine code from the cache.
    """
    serial = njit(**_jit)(fn)
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_parallel",
                              fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_parallel"
    parallel = njit(parallel=True, **_jit)(twin)
    return serial, parallel


_scores_kernel = _build(_scores_rows)
_softmax_kernel = _build(_softmax_rows)
_weights_kernel = _build(_weights_rows)
_weighted_sum_kernel = _build(_weighted_sum_rows)
_attention_kernel = _build(_attention_rows)
_fused_kernel = _build(_fused_blocks)
_project_kernel = _build(_project_rows)
_merge_project_kernel = _build(_merge_project_rows)
_sinusoid_kernel = _build(_sinusoid_rows)


# Which kernel body each driver launches (its Python source is shown on the pages).
KERNELS = {
    "scaled_scores": _scores_kernel[0], "softmax_rows": _softmax_kernel[0],
    "attention_weights": _weights_kernel[0], "weighted_sum": _weighted_sum_kernel[0],
    "attention_with_weights": _attention_kernel[0], "fused_attention": _fused_kernel[0],
    "project_heads": _project_kernel[0], "merge_heads_project": _merge_project_kernel[0],
    "sinusoidal": _sinusoid_kernel[0],
}


def _pick(kernel_pair, work: int):
    return kernel_pair[1] if work >= PARALLEL_MIN_WORK else kernel_pair[0]


# --- host drivers ----------------------------------------------------------------------------


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` -> (B, H, Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    S = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    _pick(_scores_kernel, S.size * dk)(Q, K, mask, Q.dtype.type(scale), S, QUERY_BLOCK)
    return S


def softmax_rows(S):
    """Row-wise softmax over the last axis; all -inf rows give zeros."""
    A = np.empty_like(S)
    _pick(_softmax_kernel, S.size * 8)(S, A)
    return A


def attention_weights(Q, K, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` -> (B, H, Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    A = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    _pick(_weights_kernel, A.size * (dk + 8))(Q, K, mask, Q.dtype.type(scale), A, QUERY_BLOCK)
    return A


def weighted_sum(A, V):
    """``out = A V`` -> (B, H, Tq, d_v)."""
    out = np.empty(A.shape[:3] + (V.shape[3],), dtype=V.dtype)
    _pick(_weighted_sum_kernel, A.size * V.shape[3])(A, V, out, QUERY_BLOCK)
    return out


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` and ``out = A V`` in one pass over each row."""
    B, H, Tq, dk = Q.shape
    A = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    work = A.size * (dk + V.shape[3] + 8)
    _pick(_attention_kernel, work)(Q, K, V, mask, Q.dtype.type(scale), A, out, QUERY_BLOCK)
    return out, A


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + M) V`` without materialising the (Tq, Tk) weights."""
    B, H, Tq, dk = Q.shape
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    work = B * H * Tq * K.shape[2] * (dk + V.shape[3] + 8)
    _pick(_fused_kernel, work)(Q, K, V, mask, Q.dtype.type(scale), out, QUERY_BLOCK, KEY_TILE)
    return out


def project_heads(X, W, b, n_heads):
    """``X W + b`` split into heads -> (B, H, T, d)."""
    B, T, _ = X.shape
    out = np.empty((B, n_heads, T, W.shape[1] // n_heads), dtype=X.dtype)
    _pick(_project_kernel, X.size * W.shape[1])(X, W, b, out)
    return out


def merge_heads_project(O, W_O, b_O):
    """``Concat(O_1..O_H) W_O + b_O`` -> (B, T, d_out)."""
    B, H, T, dv = O.shape
    out = np.empty((B, T, W_O.shape[1]), dtype=O.dtype)
    _pick(_merge_project_kernel, O.size * W_O.shape[1])(O, W_O, b_O, out)
    return out


def sinusoidal(T, d_model, base, dtype):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))`` -> (T, d_model)."""
    PE = np.empty((T, d_model), dtype=dtype)
    _pick(_sinusoid_kernel, T * d_model * 16)(PE.dtype.type(base), PE)
    return PE


def warm_up(dtype, builds=(0,)) -> None:
    """Compile (or load from the on-disk cache) every kernel for one dtype.

    Serial builds only by default: a lesson page's inputs sit below ``PARALLEL_MIN_WORK``, and
    each parallel build costs seconds to compile, paid on the first large input instead.
    ``builds=(0, 1)`` compiles both (for an image build that should ship every kernel compiled).
    """
    dtype = np.dtype(dtype)
    X4 = np.ones((1, 1, 2, 2), dtype)                   # Q, K, V, scores, weights, outputs
    X3, W, b = np.ones((1, 2, 2), dtype), np.ones((2, 2), dtype), np.zeros(2, dtype)
    mask, scale = np.zeros((1, 1, 1, 1), dtype), dtype.type(1.0)
    for build in builds:
        _scores_kernel[build](X4, X4, mask, scale, X4.copy(), QUERY_BLOCK)
        _softmax_kernel[build](X4, X4.copy())
        _weights_kernel[build](X4, X4, mask, scale, X4.copy(), QUERY_BLOCK)
        _weighted_sum_kernel[build](X4, X4, X4.copy(), QUERY_BLOCK)
        _attention_kernel[build](X4, X4, X4, mask, scale, X4.copy(), X4.copy(), QUERY_BLOCK)
        _fused_kernel[build](X4, X4, X4, mask, scale, X4.copy(), QUERY_BLOCK, KEY_TILE)
        _project_kernel[build](X3, W, b, X4.copy())
        _merge_project_kernel[build](X4, W, b, X3.copy())
        _sinusoid_kernel[build](scale, W.copy())
    X2 = np.ones((2, 2), dtype)                         # the lesson pages' (T, d) inputs
    small_attention(X2, X2, X2, mask, math.nan, 1.0, PARALLEL_MIN_WORK)


# --- one-call entry for small inputs -------------------------------------------------------
# At the lesson pages' sizes (a few heads of six tokens) the Python around a kernel (checks,
# reshapes, allocations, dispatching eight arguments) costs more than the arithmetic. This entry
# takes the inputs as the user gave them (C-contiguous ndarrays of one float dtype, 2-D to 4-D),
# checks them and computes in one compiled call. It returns a status instead of raising: on any
# non-zero status the caller runs the ordinary path, which raises the precise message (or, for
# SMALL_TOO_BIG, computes with the big kernels). It calls no other kernel, so loading it from the
# on-disk cache loads everything it needs.

SMALL_OK, SMALL_REFUSED, SMALL_TOO_BIG = 0, 1, 2
# Up to this much work (as PARALLEL_MIN_WORK counts it) the simple loops below, whose fixed cost
# is several microseconds lower, beat the transposed, unrolled kernels (measured: they win at
# (H, T, d) = (8, 8, 16), work 20k, and lose at (8, 16, 8), work 49k).
SMALL_MAX_WORK = 1 << 15


def _view_4d(x):
    """``x`` with ones prepended to four axes (as ``core.attention._as_4d``), inside kernels."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


@overload(_view_4d)
def _view_4d_overload(x):
    if x.ndim == 4:
        return lambda x: x
    if x.ndim == 3:
        return lambda x: x.reshape((1, x.shape[0], x.shape[1], x.shape[2]))
    if x.ndim == 2:
        return lambda x: x.reshape((1, 1, x.shape[0], x.shape[1]))
    if x.ndim == 1:
        return lambda x: x.reshape((1, 1, 1, x.shape[0]))
    if x.ndim == 0:
        return lambda x: x.reshape((1, 1, 1, 1))
    return None


def _view_like(x4, ref):
    """4-D ``x4`` with its leading axes dropped to ``ref.ndim`` axes, inside kernels."""
    return x4.reshape(x4.shape[4 - ref.ndim:])


@overload(_view_like)
def _view_like_overload(x4, ref):
    if ref.ndim == 4:
        return lambda x4, ref: x4
    if ref.ndim == 3:
        return lambda x4, ref: x4.reshape((x4.shape[1], x4.shape[2], x4.shape[3]))
    if ref.ndim == 2:
        return lambda x4, ref: x4.reshape((x4.shape[2], x4.shape[3]))
    return None


@njit(inline="always", **_jit)
def _small_rows(Q, K, V, mask, scale, A, out):
    """``A = softmax(Q K^T * scale + M)``, ``out = A V`` with plain loops and no scratch arrays:
    for a handful of keys the key transpose and four-way unrolling of the big kernel cost more
    than they save. Q (B, H, Tq, d_k), K (B, H, Tk, d_k), V (B, H, Tk, d_v), A (B, H, Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    Tk, dv = K.shape[2], V.shape[3]
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                q, row, o = Q[b, h, i], A[b, h, i], out[b, h, i]
                m = _mask_row(mask, b, h, i)
                top = -np.inf
                for j in range(Tk):
                    k = K[b, h, j]
                    s = row.dtype.type(0)
                    for d in range(dk):
                        s += q[d] * k[d]
                    s = s * scale + (m[j] if m.shape[0] > 1 else m[0])
                    row[j] = s
                    if s > top:
                        top = s
                for d in range(dv):
                    o[d] = 0.0
                if top == -np.inf:               # nothing allowed: zero weights, zero output
                    for j in range(Tk):
                        row[j] = 0.0
                    continue
                total = row.dtype.type(0)
                for j in range(Tk):
                    e = fast_exp(row[j] - top)   # exactly 0 for masked keys
                    row[j] = e
                    total += e
                inv = row.dtype.type(1) / total
                for j in range(Tk):
                    w = row[j] * inv
                    row[j] = w
                    v = V[b, h, j]
                    for d in range(dv):
                        o[d] += w * v[d]


@njit(cache=True, fastmath=FASTMATH)
def small_attention(Q, K, V, mask, scale, limit, min_work):
    """Checks and attention with weights in one call: ``(status, out, A)``.

    ``Q, K, V`` as the user gave them (same ndim, 2-D to 4-D, one float dtype, C-contiguous);
    ``mask`` an additive mask of their dtype, 0-D to 4-D; ``scale`` NaN for the default
    ``1/sqrt(d_k)``; ``limit`` the largest score allowed (see ``_check_scores_fit``). Only when
    status is ``SMALL_OK`` are ``out`` and ``A`` the results.
    """
    Q4, K4, V4, M4 = _view_4d(Q), _view_4d(K), _view_4d(V), _view_4d(mask)
    B, H, Tq, dk = Q4.shape
    Tk, dv = K4.shape[2], V4.shape[3]
    status = SMALL_REFUSED
    # shapes: nothing empty, shared batch/head axes, d_k and key counts that agree
    ok = Q.size > 0 and K.size > 0 and V.size > 0 and K4.shape[3] == dk and V4.shape[2] == Tk
    for a in range(2):
        ok = ok and K4.shape[a] == Q4.shape[a] and V4.shape[a] == Q4.shape[a]
    # the mask broadcasts to (B, H, Tq, Tk): each axis is 1 or the scores' own
    for a, n in enumerate((B, H, Tq, Tk)):
        ok = ok and (M4.shape[a] == 1 or M4.shape[a] == n)
    work = B * H * Tq * Tk * (dk + dv + 8)
    if ok and (work > SMALL_MAX_WORK or work >= min_work):
        status = SMALL_TOO_BIG
    elif ok:
        s64 = 1.0 / math.sqrt(dk) if scale != scale else scale
        pq, pk, pv = max_abs_bits(Q.ravel()), max_abs_bits(K.ravel()), max_abs_bits(V.ravel())
        ok = (math.isfinite(pq) and math.isfinite(pk) and math.isfinite(pv)
              and pq * abs(s64) * max(pk * dk, 1.0) <= limit and mask_values_ok(M4.ravel()))
        if ok:
            A4 = np.empty((B, H, Tq, Tk), dtype=Q.dtype)
            out4 = np.empty((B, H, Tq, dv), dtype=Q.dtype)
            _small_rows(Q4, K4, V4, M4, Q.dtype.type(s64), A4, out4)
            return SMALL_OK, _view_like(out4, Q), _view_like(A4, Q)
    nothing = np.empty((0, 0, 0, 0), dtype=Q.dtype)    # refused: no results to allocate
    return status, _view_like(nothing, Q), _view_like(nothing, Q)


KERNELS["small_attention"] = small_attention
