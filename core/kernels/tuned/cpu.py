"""Numba CPU kernels (``@njit``) for attention, masking, multi-head projection and positional encoding.

Host drivers here and in ``core/kernels/tuned/gpu.py`` share names and signatures; ``core/attention.py`` picks one.
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

import numba
import numpy as np
from numba import njit, prange

from core.kernels.tuned import simd, target
from core.kernels.tuned.borrow import borrowed
from core.kernels.tuned.fastexp import fast_exp
from core.kernels.tuned.floatbits import max_of
from core.kernels.warm_inputs import tiny_inputs

# Reassociation lets LLVM vectorise the dot products; no flag here touches inf/NaN semantics,
# which the -inf masks rely on (so no 'nnan', 'ninf' or plain fastmath=True).
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
# Below this many multiply-adds a call runs serially (tunable, and patched by tests).
PARALLEL_MIN_WORK = 1 << 16
# Queries handled together by one parallel work unit when a unit is not a whole head (see
# _query_block; 16 to 64 measured alike at T = 64 and 128), and keys per tile in the fused kernel
# (chosen with the register tile, from the compile target, in target.py).
QUERY_BLOCK = 32
KEY_TILE = target.KEY_BLOCK

_jit = dict(cache=True, fastmath=FASTMATH)
# The loops of one work unit (a block of queries of one head) are an ordinary compiled function,
# shared by a kernel's serial and parallel builds: compiled once and cached, instead of once per
# build. Everything it calls is inlined into it (inline="always"): calls that pass a dozen arrays
# each (seven machine words per 1-D array) had cost a fifth to a third of the time at 64 keys.


# --- device-side helpers -----------------------------------------------------------------


@njit(inline="always", **_jit)
def _mask_row(mask, b, h, i):
    """The mask's row for query (b, h, i), honouring broadcast axes of length 1: (1,) or (Tk,)."""
    return mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0, i if mask.shape[2] > 1 else 0]


@njit(inline="always", **_jit)
def _round_up(n, step):
    return (n + step - 1) // step * step


@njit(inline="always", **_jit)
def _transpose_keys(K, Kt, b, h):
    """``Kt[b, h, p, :, c] = K[b, h, p * W + c]`` (``W = Kt.shape[4]``, two vectors): the keys cut
    into panels of ``W`` keys, each panel stored transposed, so that one SIMD vector holds one
    feature of several keys and a register tile (4 queries by one panel) reads its panel from
    start to end, ``d_k * W`` contiguous numbers, as a BLAS kernel reads its packed operand.
    The last panel is zero beyond the last key, so whole vectors may run past it.

    With one row of ``Kt`` per feature instead (``d_k`` rows as long as the keys), each step of the
    tile loaded from a different row: at T = 512, d_k = 64 the scores ran at 66 % of one core's
    sgemm against 89 % for ``A V``, whose value rows are read in order.

    Done once per head, before the work is split into blocks of queries (each block transposing
    for itself cost as much as its arithmetic).
    """
    kt, Tk, W = Kt[b, h], K.shape[2], Kt.shape[4]
    for j in range(Tk):
        k, panel, c = K[b, h, j], kt[j // W], j % W
        for d in range(K.shape[3]):
            panel[d, c] = k[d]
    for j in range(Tk, kt.shape[0] * W):
        panel, c = kt[j // W], j % W
        for d in range(K.shape[3]):
            panel[d, c] = 0.0


@njit(inline="always", **_jit)
def _pad_values(V, Vp, b, h):
    """``Vp[b, h, j, :d_v] = V[b, h, j]``, zero beyond: value rows a whole number of vectors long."""
    dv = V.shape[3]
    for j in range(V.shape[2]):
        row, v = Vp[b, h, j], V[b, h, j]
        for c in range(dv):
            row[c] = v[c]
        _fill(row, dv, row.shape[0], 0.0)


@njit(inline="always", **_jit)
def _fill(x, lo, hi, value):
    """``x[lo:hi] = value`` as a plain loop (a slice assignment costs ~20 ns of setup, which
    dominates at the lesson pages' six-token rows), and nothing at all for an empty range: the
    two fills around each causal row's live keys, one of them always empty, had cost 8 % of a
    64-key attention with weights."""
    if hi > lo:
        y = x[lo:hi]                           # zero-based, so the loop vectorises (see _add_mask)
        for j in range(hi - lo):
            y[j] = value


@njit(inline="always", **_jit)
def _copy(x, y, n):
    """``y[:n] = x[:n]`` as a plain loop (see :func:`_fill`)."""
    for j in range(n):
        y[j] = x[j]


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


@njit(inline="always", **_jit)
def _add_mask(live, m, j):
    """``live += m[j:j+len(live)]`` (or ``+= m[0]`` for a mask broadcast along keys, skipped when
    it is 0: the scores arrive already scaled, the scale folded into the query).

    Loops start at 0 over slices: LLVM then knows no index is negative (Numba's wraparound for
    negative indices would otherwise stop the vectoriser).
    """
    if m.shape[0] > 1:
        mj = m[j:j + live.shape[0]]
        for k in range(live.shape[0]):
            live[k] += mj[k]
    elif m[0] != 0.0:
        for k in range(live.shape[0]):
            live[k] += m[0]


@njit(inline="always", **_jit)
def _product_block(a0, a1, a2, a3, B, t0, n, c, like):
    """A 4 x (2 vectors) block of a matrix product: ``sum_{t < n} a_r[t] B[t0 + t, c : c + 2 lanes]``
    for the four rows ``a_r``, as eight vectors (row 0's two, then row 1's, ...).

    The register tile of a BLAS kernel: the eight running sums stay in SIMD registers for the
    whole loop; each step loads two vectors of ``B``, broadcasts four numbers of ``a`` and does
    eight fused multiply-adds. ``like`` is any array of the result's dtype.
    """
    L = simd.lanes_of(like)
    x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = simd.zeros(like)
    for t in range(n):
        row = B[t0 + t]
        u, v = simd.load(row, c), simd.load(row, c + L)
        w = simd.splat(a0[t], like)
        x0, y0 = simd.fma(w, u, x0), simd.fma(w, v, y0)
        w = simd.splat(a1[t], like)
        x1, y1 = simd.fma(w, u, x1), simd.fma(w, v, y1)
        w = simd.splat(a2[t], like)
        x2, y2 = simd.fma(w, u, x2), simd.fma(w, v, y2)
        w = simd.splat(a3[t], like)
        x3, y3 = simd.fma(w, u, x3), simd.fma(w, v, y3)
    return x0, y0, x1, y1, x2, y2, x3, y3


@njit(inline="always", **_jit)
def _product_vector(a0, a1, a2, a3, B, t0, n, c, like):
    """:func:`_product_block` one vector wide (for the last vector of a row): four vectors."""
    x0 = x1 = x2 = x3 = simd.zeros(like)
    for t in range(n):
        u = simd.load(B[t0 + t], c)
        x0 = simd.fma(simd.splat(a0[t], like), u, x0)
        x1 = simd.fma(simd.splat(a1[t], like), u, x1)
        x2 = simd.fma(simd.splat(a2[t], like), u, x2)
        x3 = simd.fma(simd.splat(a3[t], like), u, x3)
    return x0, x1, x2, x3


@njit(inline="always", **_jit)
def _scores_tile(Qs, Kt, k0, lo, hi, s0, s1, s2, s3):
    """``s_r[j] = Qs[r] . K[k0 + j]`` for four (scaled) queries ``Qs`` and the keys ``lo <= j < hi``
    of a tile starting at key ``k0`` (a whole number of panels), where ``Kt`` holds the keys in
    panels (see :func:`_transpose_keys`): blocks of ``Q K^T`` (:func:`_product_block`), summed over
    the features. Whole vectors only: the columns from ``lo`` rounded down to a vector boundary
    to ``hi`` rounded up are written, so the rows are padded by a vector.
    """
    L, dk, W = simd.lanes_of(s0), Qs.shape[1], Kt.shape[2]
    q0, q1, q2, q3 = Qs[0], Qs[1], Qs[2], Qs[3]
    j = lo - lo % L
    while j < hi:
        p, c = (k0 + j) // W, (k0 + j) % W
        if c == 0 and j + L < hi:              # a whole panel: two vectors of keys
            x0, y0, x1, y1, x2, y2, x3, y3 = _product_block(q0, q1, q2, q3, Kt[p], 0, dk, 0, s0)
            simd.store(s0, j, x0), simd.store(s1, j, x1), simd.store(s2, j, x2), simd.store(s3, j, x3)
            simd.store(s0, j + L, y0), simd.store(s1, j + L, y1), simd.store(s2, j + L, y2), simd.store(s3, j + L, y3)
            j += W
        else:                                  # one vector: a panel's first or second half
            x0, x1, x2, x3 = _product_vector(q0, q1, q2, q3, Kt[p], 0, dk, c, s0)
            simd.store(s0, j, x0), simd.store(s1, j, x1), simd.store(s2, j, x2), simd.store(s3, j, x3)
            j += L


@njit(inline="always", **_jit)
def _scores_group(Q, Kt, mask, scale, b, h, i, n, k0, n_keys, Qs, S):
    """Scores of the ``n`` (1 to 4) queries ``i .. i+n-1`` against the keys ``k0 .. k0+n_keys``, in
    rows ``0 .. n-1`` of the scratch ``S``; returns the live range ``[lo, hi)``, the union of the
    rows' own (masked keys inside it get -inf from the mask). Only that range of ``S`` is valid.

    ``Qs`` (4, d_k) receives the queries times the scale (rows past ``n`` repeat the last query,
    so the tile always computes four).
    """
    lo, hi = n_keys, 0
    for r in range(n):
        a, c = _live_keys(_mask_row(mask, b, h, i + r), k0, n_keys)
        if a < c:
            lo, hi = min(lo, a), max(hi, c)
    if lo >= hi:
        return 0, 0                            # nothing live for any of them
    for r in range(4):
        q, qs = Q[b, h, i + min(r, n - 1)], Qs[r]
        for d in range(q.shape[0]):
            qs[d] = q[d] * scale
    _scores_tile(Qs, Kt, k0, lo, hi, S[0], S[1], S[2], S[3])
    for r in range(n):
        _add_mask(S[r, lo:hi], _mask_row(mask, b, h, i + r), k0 + lo)
    return lo, hi


@njit(inline="always", **_jit)
def _softmax_in_place(x):
    """``x = softmax(x)``; a row with nothing allowed (all -inf) gives zeros.

    Accumulators stay in the row's dtype (a float64 ``total`` would turn every float32 exp into a
    float64 one), and ``fast_exp`` is the vectorisable polynomial for float32, exact 0 at -inf.
    """
    if x.shape[0] == 0:
        return
    m = max_of(x, x[0])
    if m == -np.inf:
        _fill(x, 0, x.shape[0], 0.0)
        return
    total = x.dtype.type(0)
    for j in range(x.shape[0]):
        x[j] = fast_exp(x[j] - m)
        total += x[j]
    inv = x.dtype.type(1) / total
    for j in range(x.shape[0]):
        x[j] *= inv


@njit(inline="always", **_jit)
def _softmax_live(scores, lo, hi, weights):
    """The softmax of ``scores`` over the live keys ``[lo, hi)``: in place there (the weighted sum
    reads it from there), and copied into ``weights``, exactly 0 outside."""
    _softmax_in_place(scores[lo:hi])
    _copy(scores[lo:hi], weights[lo:hi], hi - lo)
    _fill(weights, 0, lo, 0.0)
    _fill(weights, hi, weights.shape[0], 0.0)


@njit(inline="always", **_jit)
def _weighted_sum_tile(p0, p1, p2, p3, Vp, k0, lo, hi, o0, o1, o2, o3):
    """``o_r += sum_{lo <= j < hi} p_r[j] V[k0 + j]`` for four rows of weights ``p_r`` over a tile of
    keys from ``k0``: blocks of ``A V`` (:func:`_product_block`), summed over the keys. ``Vp``
    holds the value rows padded to whole vectors, as wide as the ``o_r``.
    """
    L, width = simd.lanes_of(o0), o0.shape[0]
    w0, w1, w2, w3 = p0[lo:hi], p1[lo:hi], p2[lo:hi], p3[lo:hi]   # zero-based (see _add_mask)
    c = 0
    while c + L < width:                       # two vectors of value features
        x0, y0, x1, y1, x2, y2, x3, y3 = _product_block(w0, w1, w2, w3, Vp, k0 + lo, hi - lo, c, o0)
        _add_vector(o0, c, x0), _add_vector(o1, c, x1), _add_vector(o2, c, x2), _add_vector(o3, c, x3)
        _add_vector(o0, c + L, y0), _add_vector(o1, c + L, y1)
        _add_vector(o2, c + L, y2), _add_vector(o3, c + L, y3)
        c += 2 * L
    if c < width:                              # one vector left
        x0, x1, x2, x3 = _product_vector(w0, w1, w2, w3, Vp, k0 + lo, hi - lo, c, o0)
        _add_vector(o0, c, x0), _add_vector(o1, c, x1), _add_vector(o2, c, x2), _add_vector(o3, c, x3)


@njit(inline="always", **_jit)
def _add_vector(x, i, v):
    """``x[i : i + lanes] += v``."""
    simd.store(x, i, simd.add(simd.load(x, i), v))


@njit(inline="always", **_jit)
def _panel_keys(Kt):
    """Keys the panels of ``Kt`` hold: the key count rounded up to a whole panel."""
    return Kt.shape[2] * Kt.shape[4]


@njit(inline="always", **_jit)
def _unit(u, H, n_blocks, Tq, block):
    """Work unit ``u`` -> (batch, head, first query, end query): one block of queries of one head."""
    b, h, qb = u // (H * n_blocks), (u // n_blocks) % H, u % n_blocks
    return b, h, qb * block, min(qb * block + block, Tq)


# --- kernels: one function per operation, serial and parallel builds ----------------------
# The parallel loop runs over work units: whole heads, each laying out its own keys (and values)
# for the SIMD tiles first, or (batch, head, block of queries) after one parallel pass has laid
# out every head's (see _query_block for which). Each unit's loops run in a function of their own
# that borrows its array arguments (see core/kernels/tuned/borrow.py): the unit allocates its scratch, the
# function uses it without reference counting.


@njit(**_jit)
def _scores_unit(Q, Kt, mask, scale, b, h, i0, i1, S, Qs, S4):
    Q, Kt, mask, S, Qs, S4 = borrowed(Q), borrowed(Kt), borrowed(mask), borrowed(S), borrowed(Qs), borrowed(S4)
    Tk = S.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        lo, hi = _scores_group(Q, Kt[b, h], mask, scale, b, h, i, n, 0, Tk, Qs, S4)
        for r in range(n):
            row = S[b, h, i + r]
            _copy(S4[r, lo:hi], row[lo:hi], hi - lo)
            _fill(row, 0, lo, -np.inf)
            _fill(row, hi, Tk, -np.inf)


def _scores_rows(Q, K, mask, scale, S, Kt, block):
    B, H, Tq, Tk = S.shape
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _transpose_keys(K, Kt, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _transpose_keys(K, Kt, b, h)
        _scores_unit(Q, Kt, mask, scale, b, h, i0, i1, S,
                     np.empty((4, Q.shape[3]), Q.dtype), np.empty((4, _panel_keys(Kt)), Q.dtype))


@njit(**_jit)
def _weights_unit(Q, Kt, Vp, mask, scale, b, h, i0, i1, A, out, Qs, S4, O4):
    """Rows ``i0..i1`` of ``A = softmax(Q K^T * scale + M)``, four queries at a time (see
    :func:`_scores_tile`), and ``out = A V`` for them."""
    Q, Kt, Vp, mask, A, out = borrowed(Q), borrowed(Kt), borrowed(Vp), borrowed(mask), borrowed(A), borrowed(out)
    Qs, S4, O4 = borrowed(Qs), borrowed(S4), borrowed(O4)
    Tk, dv = A.shape[3], out.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        lo, hi = _scores_group(Q, Kt[b, h], mask, scale, b, h, i, n, 0, Tk, Qs, S4)
        for r in range(n):
            _softmax_live(S4[r], lo, hi, A[b, h, i + r])
        for r in range(4):
            _fill(O4[r], 0, O4.shape[1], 0.0)
        # The weights for A V from the scratch rows, which stay in L1, not from A: at 8 heads of
        # 64 causal keys, 25-29 us against 29-40 us (it varied from one process to the next).
        last = n - 1                           # rows past n repeat the last one, into O4 only
        _weighted_sum_tile(S4[0], S4[min(1, last)], S4[min(2, last)], S4[min(3, last)],
                           Vp[b, h], 0, lo, hi, O4[0], O4[1], O4[2], O4[3])
        for r in range(n):
            _copy(O4[r], out[b, h, i + r], dv)


def _attention_rows(Q, K, V, mask, scale, A, out, Kt, Vp, block):
    B, H, Tq = A.shape[0], A.shape[1], A.shape[2]
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _transpose_keys(K, Kt, u // H, u % H)
            _pad_values(V, Vp, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _transpose_keys(K, Kt, b, h)
            _pad_values(V, Vp, b, h)
        _weights_unit(Q, Kt, Vp, mask, scale, b, h, i0, i1, A, out,
                      np.empty((4, Q.shape[3]), Q.dtype), np.empty((4, _panel_keys(Kt)), Q.dtype),
                      np.empty((4, Vp.shape[3]), Q.dtype))


@njit(**_jit)
def _weighted_sum_unit(A, Vp, b, h, i0, i1, out, O4):
    A, Vp, out, O4 = borrowed(A), borrowed(Vp), borrowed(out), borrowed(O4)
    Tk, dv = A.shape[3], out.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        last = i + n - 1
        for r in range(4):
            _fill(O4[r], 0, O4.shape[1], 0.0)
        _weighted_sum_tile(A[b, h, i], A[b, h, min(i + 1, last)], A[b, h, min(i + 2, last)],
                           A[b, h, min(i + 3, last)], Vp[b, h], 0, 0, Tk, O4[0], O4[1], O4[2], O4[3])
        for r in range(n):
            _copy(O4[r], out[b, h, i + r], dv)


def _weighted_sum_rows(A, V, out, Vp, block):
    B, H, Tq, Tk = A.shape
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _pad_values(V, Vp, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _pad_values(V, Vp, b, h)
        _weighted_sum_unit(A, Vp, b, h, i0, i1, out, np.empty((4, Vp.shape[3]), A.dtype))


@njit(inline="always", **_jit)
def _online_rescale(s, lo, hi, r, m, l, acc):
    """Turn one tile's scores ``s[lo:hi]`` of query ``r`` into ``exp(score - m)`` for its running max
    ``m[r]``, raising that max (and rescaling the normaliser ``l[r]`` and the unnormalised output
    ``acc[r]`` by ``exp(m_old - m_new)``) when the tile holds a larger score. A query with nothing
    live so far gets zeros, so the weighted sum that follows adds nothing for it."""
    live = s[lo:hi]                           # zero-based, so the loops vectorise (see _add_mask)
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


@njit(**_jit)
def _fused_unit(Q, Kt, Vp, mask, scale, b, h, i0, i1, out, key_tile, Qs, S4, m, l, acc):
    """Queries ``i0..i1`` of the fused kernel: per query the running max ``m``, normaliser ``l`` and
    unnormalised output ``acc`` over the key tiles; ``acc`` has three spare rows past the block's
    for the repeated rows of a last group of fewer than four queries."""
    Q, Kt, Vp, mask, out = borrowed(Q), borrowed(Kt), borrowed(Vp), borrowed(mask), borrowed(out)
    Qs, S4, m, l, acc = borrowed(Qs), borrowed(S4), borrowed(m), borrowed(l), borrowed(acc)
    Tk, dv = Vp.shape[2], out.shape[3]
    for j0 in range(0, Tk, key_tile):
        n_keys = min(key_tile, Tk - j0)
        for i in range(i0, i1, 4):
            n, r = min(4, i1 - i), i - i0
            lo, hi = _scores_group(Q, Kt[b, h], mask, scale, b, h, i, n, j0, n_keys, Qs, S4)
            for k in range(n):
                _online_rescale(S4[k], lo, hi, r + k, m, l, acc)
            _weighted_sum_tile(S4[0], S4[1], S4[2], S4[3], Vp[b, h], j0, lo, hi,
                               acc[r], acc[r + 1], acc[r + 2], acc[r + 3])
    for i in range(i0, i1):
        r = i - i0
        inv = 1.0 / l[r] if l[r] > 0.0 else 0.0  # nothing allowed: zeros, never NaN
        for d in range(dv):
            out[b, h, i, d] = acc[r, d] * inv


def _fused_blocks(Q, K, V, mask, scale, out, Kt, Vp, block, key_tile):
    """Online softmax over key tiles, FlashAttention-style: per query keep the running max ``m``,
    the running normaliser ``l`` and the unnormalised output ``acc``; rescale both by
    ``exp(m_old - m_new)`` when a tile raises the max. Extra memory: the laid-out keys and values
    (``Kt``, ``Vp``: about the size of K and V) and, per unit, O(key_tile + block * d_v); never
    (Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    key_tile = _round_up(max(key_tile, 1), Kt.shape[4])   # whole panels of keys (see _scores_tile)
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _transpose_keys(K, Kt, u // H, u % H)
            _pad_values(V, Vp, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _transpose_keys(K, Kt, b, h)
            _pad_values(V, Vp, b, h)
        _fused_unit(Q, Kt, Vp, mask, scale, b, h, i0, i1, out, key_tile,
                    np.empty((4, dk), Q.dtype), np.empty((4, _round_up(key_tile, simd.lanes_of(Q))), Q.dtype),
                    np.full(i1 - i0, -np.inf, Q.dtype), np.zeros(i1 - i0, Q.dtype),
                    np.zeros((i1 - i0 + 3, Vp.shape[3]), Q.dtype))


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
_weighted_sum_kernel = _build(_weighted_sum_rows)
_attention_kernel = _build(_attention_rows)
_fused_kernel = _build(_fused_blocks)
_project_kernel = _build(_project_rows)
_merge_project_kernel = _build(_merge_project_rows)
_sinusoid_kernel = _build(_sinusoid_rows)


# Which kernel body each driver launches (its Python source is shown on the pages).
KERNELS = {
    "scaled_scores": _scores_kernel[0], "weighted_sum": _weighted_sum_kernel[0],
    "attention_with_weights": _attention_kernel[0], "fused_attention": _fused_kernel[0],
    "project_heads": _project_kernel[0], "merge_heads_project": _merge_project_kernel[0],
    "sinusoidal": _sinusoid_kernel[0],
}


def _pick(kernel_pair, work: int):
    return kernel_pair[1] if work >= PARALLEL_MIN_WORK else kernel_pair[0]


def _query_block(B: int, H: int, Tq: int, work: int) -> int:
    """Queries per work unit: a whole head when one thread runs them all or when the heads share
    evenly among the threads, else ``QUERY_BLOCK``.

    A unit that is a whole head lays out its own head's keys and values, so the kernel runs one
    parallel loop instead of two (10 % faster at 8 heads of T = 64 and 128 on 2 cores). Blocks
    keep every thread busy when the heads do not share evenly (one head of T = 2048, say).
    """
    if work < PARALLEL_MIN_WORK or (B * H) % numba.get_num_threads() == 0:
        return Tq
    return QUERY_BLOCK


# --- host drivers ----------------------------------------------------------------------------


def _keys_layout(K):
    """Room for the keys in panels of two vectors (see _transpose_keys)."""
    B, H, Tk, dk = K.shape
    W = 2 * simd.lanes(K.dtype)
    return np.empty((B, H, (Tk + W - 1) // W, dk, W), dtype=K.dtype)


def _values_layout(V):
    """Room for the value rows padded to whole vectors (see _pad_values)."""
    B, H, Tk, dv = V.shape
    L = simd.lanes(V.dtype)
    return np.empty((B, H, Tk, (dv + L - 1) // L * L), dtype=V.dtype)


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` -> (B, H, Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    S = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    work = S.size * dk
    _pick(_scores_kernel, work)(Q, K, mask, Q.dtype.type(scale), S, _keys_layout(K), _query_block(B, H, Tq, work))
    return S


def weighted_sum(A, V):
    """``out = A V`` -> (B, H, Tq, d_v)."""
    out = np.empty(A.shape[:3] + (V.shape[3],), dtype=V.dtype)
    work = A.size * V.shape[3]
    _pick(_weighted_sum_kernel, work)(A, V, out, _values_layout(V), _query_block(*A.shape[:3], work))
    return out


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` and ``out = A V`` in one pass over each row."""
    B, H, Tq, dk = Q.shape
    A = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    work = A.size * (dk + V.shape[3] + 8)
    _pick(_attention_kernel, work)(Q, K, V, mask, Q.dtype.type(scale), A, out, _keys_layout(K), _values_layout(V),
                                   _query_block(B, H, Tq, work))
    return out, A


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + M) V`` without materialising the (Tq, Tk) weights."""
    B, H, Tq, dk = Q.shape
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    work = B * H * Tq * K.shape[2] * (dk + V.shape[3] + 8)
    _pick(_fused_kernel, work)(Q, K, V, mask, Q.dtype.type(scale), out, _keys_layout(K), _values_layout(V),
                               _query_block(B, H, Tq, work), KEY_TILE)
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
    """Compile (or load from the on-disk cache) every tuned kernel for one dtype.

    Serial builds only by default (inputs below ``PARALLEL_MIN_WORK``: what "Make it fast" times
    at small T); ``builds=(0, 1)`` compiles the parallel builds too, which cost seconds each.
    The lesson pages never get here: the dispatch gives them the lesson kernels.
    """
    dtype = np.dtype(dtype)
    X4, X3, W, b, mask = tiny_inputs(dtype)
    scale = dtype.type(1.0)
    for build in builds:
        Kt, Vp = _keys_layout(X4), _values_layout(X4)
        _scores_kernel[build](X4, X4, mask, scale, X4.copy(), Kt, QUERY_BLOCK)
        _weighted_sum_kernel[build](X4, X4, X4.copy(), Vp, QUERY_BLOCK)
        _attention_kernel[build](X4, X4, X4, mask, scale, X4.copy(), X4.copy(), Kt, Vp, QUERY_BLOCK)
        _fused_kernel[build](X4, X4, X4, mask, scale, X4.copy(), Kt, Vp, QUERY_BLOCK, KEY_TILE)
        _project_kernel[build](X3, W, b, X4.copy())
        _merge_project_kernel[build](X4, W, b, X3.copy())
        _sinusoid_kernel[build](scale, W.copy())
