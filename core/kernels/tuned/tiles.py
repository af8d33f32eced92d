"""The building blocks of the tuned CPU kernels: register tiles and softmax pieces (the data's
layout, and the live-key ranges, are in ``layout.py``). Each is ``@njit(inline="always")``: compiled into the work-unit functions
of ``core/kernels/tuned/cpu.py`` (the drivers and kernels), never called from Python.

Numba's disk cache is keyed to the file of the function it compiles, not to the files of what it
inlines; ``core/kernel_cache.py`` adds this folder's sources to every kernel's key, so editing
this file recompiles the kernels built from it.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from core.kernels.tuned import simd
from core.kernels.tuned.fastexp import exp_vector, fast_exp
from core.kernels.tuned.floatbits import max_of
from core.kernels.tuned.layout import WIDE_TILES, _add_mask, _fill, _jit, _mask_row, _tile_keys, _wide


# --- register tiles ---------------------------------------------------------------------


@njit(inline="always", **_jit)
def _product_block(a0, a1, a2, a3, B, t0, n, c, like):
    """A 4 x (2 vectors) block of a matrix product: ``sum_{t < n} a_r[t] B[t0 + t, c : c + 2 lanes]``
    for the four rows ``a_r``, as eight vectors (row 0's two, then row 1's, ...).

    The register tile of a BLAS kernel: the eight running sums stay in SIMD registers for the
    whole loop; each step loads two vectors of ``B``, broadcasts four numbers of ``a`` and does
    eight fused multiply-adds. ``like`` is any array of the result's dtype.

    The rows of ``B`` are taken as one zero-based slice, indexed by ``t`` alone: Numba wraps a
    negative index round to the end, and with ``B[t0 + t]`` (``t0`` of unknown sign) every step
    paid for that test, about 50 instructions around eight multiply-adds in ``A V`` at d_v = 16
    (T = 64 ran 10 % faster without them).
    """
    L = simd.lanes_of(like)
    x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = simd.zeros(like)
    rows = B[t0:t0 + n]
    for t in range(n):
        row = rows[t]
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
def _product_wide_block(a0, a1, a2, a3, B, t0, n, c, like):
    """:func:`_product_block` four vectors wide, for AVX-512's 32 registers: 16 running sums, four
    loaded vectors and one broadcast number. Each step's four loads and four broadcasts feed sixteen
    fused multiply-adds (eight for the 4 x 2 block's six): the scores ran 1.10x and ``A V`` 1.07x
    faster than with the 4 x 2 block (T = 512, d_k = 64, one core). Returns four rows of four vectors.
    """
    L = simd.lanes_of(like)
    x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = z0 = z1 = z2 = z3 = v0 = v1 = v2 = v3 = simd.zeros(like)
    rows = B[t0:t0 + n]                        # zero-based (see _product_block)
    for t in range(n):
        row = rows[t]
        u0, u1, u2, u3 = simd.load(row, c), simd.load(row, c + L), simd.load(row, c + 2 * L), simd.load(row, c + 3 * L)
        w = simd.splat(a0[t], like)
        x0, x1, x2, x3 = simd.fma(w, u0, x0), simd.fma(w, u1, x1), simd.fma(w, u2, x2), simd.fma(w, u3, x3)
        w = simd.splat(a1[t], like)
        y0, y1, y2, y3 = simd.fma(w, u0, y0), simd.fma(w, u1, y1), simd.fma(w, u2, y2), simd.fma(w, u3, y3)
        w = simd.splat(a2[t], like)
        z0, z1, z2, z3 = simd.fma(w, u0, z0), simd.fma(w, u1, z1), simd.fma(w, u2, z2), simd.fma(w, u3, z3)
        w = simd.splat(a3[t], like)
        v0, v1, v2, v3 = simd.fma(w, u0, v0), simd.fma(w, u1, v1), simd.fma(w, u2, v2), simd.fma(w, u3, v3)
    return (x0, x1, x2, x3), (y0, y1, y2, y3), (z0, z1, z2, z3), (v0, v1, v2, v3)


@njit(inline="always", **_jit)
def _store_vectors(x, i, v):
    """``x[i : i + 4 lanes] = v``, four vectors."""
    L = simd.lanes_of(x)
    simd.store(x, i, v[0]), simd.store(x, i + L, v[1]), simd.store(x, i + 2 * L, v[2]), simd.store(x, i + 3 * L, v[3])


@njit(inline="always", **_jit)
def _add_vectors(x, i, v):
    """``x[i : i + 4 lanes] += v``, four vectors."""
    L = simd.lanes_of(x)
    _add_vector(x, i, v[0]), _add_vector(x, i + L, v[1]), _add_vector(x, i + 2 * L, v[2]), _add_vector(x, i + 3 * L, v[3])


@njit(inline="always", **_jit)
def _product_vector(a0, a1, a2, a3, B, t0, n, c, like):
    """:func:`_product_block` one vector wide (value rows of one vector, the last vector of a row,
    keys at the edge of a causal row): four vectors. (Two sets of four sums, for more
    multiply-adds in flight, measured slower here: 33-35 against 31-33 µs at T = 64, d_v = 16.)"""
    x0 = x1 = x2 = x3 = simd.zeros(like)
    rows = B[t0:t0 + n]                        # zero-based (see _product_block)
    for t in range(n):
        u = simd.load(rows[t], c)
        x0 = simd.fma(simd.splat(a0[t], like), u, x0)
        x1 = simd.fma(simd.splat(a1[t], like), u, x1)
        x2 = simd.fma(simd.splat(a2[t], like), u, x2)
        x3 = simd.fma(simd.splat(a3[t], like), u, x3)
    return x0, x1, x2, x3


@njit(inline="always", **_jit)
def _scores_tile(Qs, Kt, k0, lo, hi, s0, s1, s2, s3):
    """``s_r[j] = Qs[r] . K[k0 + j]`` for four (scaled) queries ``Qs`` and the keys ``lo <= j < hi``
    of a tile starting at key ``k0`` (a whole number of panels), where ``Kt`` holds the keys in
    panels (see :func:`_transpose_keys`): blocks of ``Q K^T``, a whole panel at a time
    (:func:`_product_wide_block` for panels four vectors wide, :func:`_product_block` for two),
    summed over the features. Whole vectors only: the columns from ``lo`` rounded down to a vector boundary
    to ``hi`` rounded up are written, so the rows are padded by a vector.
    """
    L, dk, W = simd.lanes_of(s0), Qs.shape[1], Kt.shape[2]
    q0, q1, q2, q3 = Qs[0], Qs[1], Qs[2], Qs[3]
    j = lo - lo % L
    while j < hi:
        p, c = (k0 + j) // W, (k0 + j) % W
        if _wide(Kt, s0) and c == 0 and j + 3 * L < hi:   # a whole panel of four vectors (AVX-512)
            x, y, z, v = _product_wide_block(q0, q1, q2, q3, Kt[p], 0, dk, 0, s0)
            _store_vectors(s0, j, x), _store_vectors(s1, j, y), _store_vectors(s2, j, z), _store_vectors(s3, j, v)
            j += 4 * L
        elif c % (2 * L) == 0 and j + L < hi:  # two vectors of keys (a whole panel on AVX2)
            x0, y0, x1, y1, x2, y2, x3, y3 = _product_block(q0, q1, q2, q3, Kt[p], 0, dk, c, s0)
            simd.store(s0, j, x0), simd.store(s1, j, x1), simd.store(s2, j, x2), simd.store(s3, j, x3)
            simd.store(s0, j + L, y0), simd.store(s1, j + L, y1), simd.store(s2, j + L, y2), simd.store(s3, j + L, y3)
            j += 2 * L
        else:                                  # one vector, at the edge of the live keys
            x0, x1, x2, x3 = _product_vector(q0, q1, q2, q3, Kt[p], 0, dk, c, s0)
            simd.store(s0, j, x0), simd.store(s1, j, x1), simd.store(s2, j, x2), simd.store(s3, j, x3)
            j += L


@njit(inline="always", **_jit)
def _scores_group(Q, Kt, mask, ranges, scale, b, h, i, n, k0, n_keys, Qs, S):
    """Scores of the ``n`` (1 to 4) queries ``i .. i+n-1`` against the keys ``k0 .. k0+n_keys``, in
    rows ``0 .. n-1`` of the scratch ``S``; returns the live range ``[lo, hi)``, the union of the
    rows' own (from ``ranges``, see :func:`_live_ranges`; masked keys inside it get -inf). Only that
    range of ``S`` is valid.

    ``Qs`` (4, d_k) receives the queries times the scale (rows past ``n`` repeat the last query,
    so the tile always computes four).
    """
    lo, hi = n_keys, 0
    for r in range(n):
        a, c = _tile_keys(ranges, b, h, i + r, k0, n_keys)
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
        if _mask_row(ranges, b, h, i + r)[2]:  # 0 on its live keys: -inf on the group's others
            a, c = _tile_keys(ranges, b, h, i + r, k0, n_keys)
            _fill(S[r], lo, a, -np.inf)
            _fill(S[r], max(c, lo), hi, -np.inf)
        else:
            _add_mask(S[r, lo:hi], _mask_row(mask, b, h, i + r), k0 + lo)
    return lo, hi


def _exp_rows(S, lo, hi, c0, c1, c2, c3):
    """``S[r, j] = exp(S[r, j] - c_r)`` for the live keys ``lo <= j < hi`` of the four rows of a
    group's scratch scores; returns the four rows' sums.

    ``c_r`` is row ``r``'s maximum (or a running one, at least as large), so no argument is above
    0; masked keys (-inf) give exactly 0. float32 runs :func:`_exp_rows_vectors`, float64
    :func:`_exp_live_keys` on each row (``math.exp``: float64 results are held to 1e-12).
    """
    raise NotImplementedError("only inside Numba kernels")


@overload(_exp_rows, inline="always")
def _exp_rows_overload(S, lo, hi, c0, c1, c2, c3):
    if S.dtype == types.float32:
        return lambda S, lo, hi, c0, c1, c2, c3: _exp_rows_vectors(S, lo, hi, c0, c1, c2, c3)
    return lambda S, lo, hi, c0, c1, c2, c3: (_exp_live_keys(S[0], lo, hi, c0), _exp_live_keys(S[1], lo, hi, c1),
                                              _exp_live_keys(S[2], lo, hi, c2), _exp_live_keys(S[3], lo, hi, c3))


@njit(inline="always", **_jit)
def _exp_rows_vectors(S, lo, hi, c0, c1, c2, c3):
    """:func:`_exp_rows` in whole vectors, from ``lo`` rounded down to a vector boundary, the four
    rows in one loop; the lanes outside ``[lo, hi)`` get 0 (nothing reads them). The rows of ``S``
    are a whole number of vectors long, so the last vector stays inside them.

    - Written as a loop over keys (:func:`_exp_live_keys`), LLVM vectorised it 8 lanes wide even on
      AVX-512, and the keys left over after the last whole vector ran one at a time, which a causal
      row's length nearly always leaves.
    - One exp is a chain of about twenty dependent instructions, and a row's sum waits for the end
      of its chain. A row at a time, short rows left the core waiting on that chain: a profile put
      15 % of the fused kernel's time on the sum alone, at 64 keys with one live key per query.
      Four rows in one loop give it four independent chains: 8 heads of causal T = 64 ran 16 %
      faster (one thread), T = 128 13 %.
    """
    s0, s1, s2, s3 = S[0], S[1], S[2], S[3]
    L = simd.lanes_of(s0)
    lane, first, end, zero = simd.lane_numbers(s0), simd.splat(lo, s0), simd.splat(hi, s0), simd.zeros(s0)
    m0, m1, m2, m3 = simd.splat(c0, s0), simd.splat(c1, s0), simd.splat(c2, s0), simd.splat(c3, s0)
    t0 = t1 = t2 = t3 = zero
    for j in range(lo - lo % L, hi, L):
        key = lane + simd.splat(j, s0)
        live = (key >= first) & (key < end)
        e0 = simd.where(live, exp_vector(simd.load(s0, j) - m0, s0), zero)
        e1 = simd.where(live, exp_vector(simd.load(s1, j) - m1, s0), zero)
        e2 = simd.where(live, exp_vector(simd.load(s2, j) - m2, s0), zero)
        e3 = simd.where(live, exp_vector(simd.load(s3, j) - m3, s0), zero)
        simd.store(s0, j, e0), simd.store(s1, j, e1), simd.store(s2, j, e2), simd.store(s3, j, e3)
        t0, t1, t2, t3 = t0 + e0, t1 + e1, t2 + e2, t3 + e3
    return simd.total(t0), simd.total(t1), simd.total(t2), simd.total(t3)


@njit(inline="always", **_jit)
def _exp_live_keys(s, lo, hi, m):
    """``s[j] = exp(s[j] - m)`` for ``lo <= j < hi``, one key at a time; returns their sum."""
    live, total = s[lo:hi], s.dtype.type(0)   # zero-based (see _add_mask); the sum in the row's dtype
    for j in range(hi - lo):
        live[j] = fast_exp(live[j] - m)
        total += live[j]
    return total


@njit(inline="always", **_jit)
def _softmax_group(S, lo, hi, n, A, i):
    """The softmax of the ``n`` (1 to 4) score rows ``0 .. n-1`` of a group's scratch ``S`` over the
    live keys ``[lo, hi)``, for the queries ``i .. i+n-1`` whose weights rows are ``A[i + r]``: in
    place in ``S`` (the weighted sum reads it from there) and copied into ``A``, exactly 0 outside;
    a row with nothing allowed (all -inf) gives zeros. Each row's max first, then the four rows'
    exps in one loop (see :func:`_exp_rows`)."""
    c0 = _live_max(S[0], lo, hi)
    c1 = _live_max(S[1], lo, hi) if n > 1 else c0
    c2 = _live_max(S[2], lo, hi) if n > 2 else c1
    c3 = _live_max(S[3], lo, hi) if n > 3 else c2
    sums = _exp_rows(S, lo, hi, c0, c1, c2, c3)
    for k in range(n):
        _normalise(S[k], lo, hi, sums[k], A[i + k])


@njit(inline="always", **_jit)
def _live_max(s, lo, hi):
    """The largest score of ``s[lo:hi]``, the shift of its exps; 0 when all are -inf (their exps
    are then exactly 0 whatever the shift)."""
    m = max_of(s[lo:hi], s.dtype.type(-np.inf))
    return m if m != -np.inf else s.dtype.type(0)


@njit(inline="always", **_jit)
def _normalise(s, lo, hi, total, weights):
    """``s[lo:hi] /= total`` (the sum of its exps), copied into ``weights``, which is 0 elsewhere;
    all zeros when the sum is 0 (nothing live: the largest live exp alone would be 1)."""
    inv = s.dtype.type(1) / total if total > 0 else s.dtype.type(0)
    live, out = s[lo:hi], weights[lo:hi]
    for j in range(hi - lo):
        live[j] *= inv
        out[j] = live[j]
    _fill(weights, 0, lo, 0.0)
    _fill(weights, hi, weights.shape[0], 0.0)


@njit(inline="always", **_jit)
def _online_rescale_group(S, lo, hi, r, n, m, l, acc):
    """One tile of keys ``[lo, hi)`` for the ``n`` (1 to 4) queries ``r .. r+n-1`` of a group of the
    fused kernel, whose scores are rows ``0 .. n-1`` of the scratch ``S``: each query's running
    max ``m``, normaliser ``l`` and unnormalised output ``acc`` are brought up to date
    (:func:`_raise_max`), then the scores become ``exp(score - m)`` (all four rows in one loop, see
    :func:`_exp_rows`) and are added to ``l``. The weighted sum that follows adds them into ``acc``.
    Rows past ``n`` repeat the last query's scores and are exponentiated with it, for the weighted
    sum's spare rows."""
    c0 = _raise_max(S[0], lo, hi, r, m, l, acc)
    c1 = _raise_max(S[1], lo, hi, r + 1, m, l, acc) if n > 1 else c0
    c2 = _raise_max(S[2], lo, hi, r + 2, m, l, acc) if n > 2 else c1
    c3 = _raise_max(S[3], lo, hi, r + 3, m, l, acc) if n > 3 else c2
    sums = _exp_rows(S, lo, hi, c0, c1, c2, c3)
    for k in range(n):
        l[r + k] += sums[k]


@njit(inline="always", **_jit)
def _raise_max(s, lo, hi, r, m, l, acc):
    """Raise query ``r``'s running max ``m[r]`` to the largest of its scores ``s[lo:hi]``, rescaling
    its normaliser ``l[r]`` and unnormalised output ``acc[r]`` by ``exp(m_old - m_new)`` when it
    rises; returns the shift for its exps: the new max, or 0 while nothing is live (its scores
    are then all -inf, and give exactly 0 whatever the shift)."""
    m_new = max_of(s[lo:hi], m[r])
    if m_new == -np.inf:
        return s.dtype.type(0)
    if m_new > m[r]:
        if m[r] != -np.inf:                   # on the first live tile l and acc are still 0: nothing to rescale
            correction = fast_exp(m[r] - m_new)
            l[r] *= correction
            for d in range(acc.shape[1]):
                acc[r, d] *= correction
        m[r] = m_new
    return m_new


@njit(inline="always", **_jit)
def _weighted_sum_tile(p0, p1, p2, p3, Vp, k0, lo, hi, o0, o1, o2, o3, wide):
    """``o_r += sum_{lo <= j < hi} p_r[j] V[k0 + j]`` for four rows of weights ``p_r`` over a tile of
    keys from ``k0``: blocks of ``A V`` (:func:`_product_wide_block` when ``wide``, else
    :func:`_product_block`), summed over the keys. ``Vp`` holds the value rows padded to whole
    vectors, as wide as the ``o_r``.
    """
    L, width = simd.lanes_of(o0), o0.shape[0]
    w0, w1, w2, w3 = p0[lo:hi], p1[lo:hi], p2[lo:hi], p3[lo:hi]   # zero-based (see _add_mask)
    c = 0
    while WIDE_TILES and wide and c + 3 * L < width:   # four vectors of value features (AVX-512)
        x, y, z, v = _product_wide_block(w0, w1, w2, w3, Vp, k0 + lo, hi - lo, c, o0)
        _add_vectors(o0, c, x), _add_vectors(o1, c, y), _add_vectors(o2, c, z), _add_vectors(o3, c, v)
        c += 4 * L
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
