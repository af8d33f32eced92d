"""Matrix products for the compiled steps, as register tiles (4 output rows by 3 or 4 SIMD vectors).

Our own products, not a BLAS: no thread pool, so a result depends on the inputs alone, bit for bit.
Twelve running sums (sixteen with AVX-512's 32 registers) stay in SIMD registers while a loop over
the shared axis feeds them (see ``core/kernels/tuned/simd.py``); written as plain loops the sums
went back to memory at every step, which ran the products 2-3x slower.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from core.kernels.tuned import simd
from core.kernels.tuned.gemm import tile3, tile4
from core.kernels.tuned.target import REGISTERS
from core.model.tuned import JIT

# With 32 vector registers (AVX-512) :func:`project` uses tiles 4 vectors wide (16 running sums + 4
# loaded + 1 broadcast = 21 registers): a chunk's rows of 256 float32 are 4 tiles exactly, where
# 3-vector tiles need 6 (the last overlapping, so 12 % of the multiply-adds were done twice).
# Every output is the same chain of multiply-adds whatever the tile: the same bits.
WIDE = REGISTERS >= 32


@njit(**JIT)
def _tile_starts(n, width, i):
    """Start of tile ``i`` of ``width`` along an axis of length ``n >= width``: the last tile is
    moved back to end at ``n``, so it may overlap the one before (its results are recomputed
    exactly, in the same order, so overlapping writes agree)."""
    return min(i * width, n - width)


@njit(**JIT)
def project(A, X, Y0, Y, add):
    """``Y = A^T X`` (``add`` False) or ``Y = Y0 + A^T X`` (``add`` True): ``Y[m] = sum_k A[k, m] X[k]``.

    ``A`` (K, M), any layout: a weight ``W`` (d_in, d_out) for the forward ``(h W)^T = W^T h^T``,
    or its transpose ``W.T`` for the backward ``(dy W^T)^T = W dy^T``. ``X`` (K, N), ``Y0`` and
    ``Y`` (M, N) C-contiguous; ``Y0`` must not be ``Y`` (tiles may be computed twice; ignored
    when ``add`` is False).
    """
    K, M = A.shape
    N = X.shape[1]
    W = 3 * simd.lanes_of(X)
    if M < 4 or N < W:
        _project_plain(A, X, Y0, Y, add)
        return
    x, y0, y = X.ravel(), Y0.ravel(), Y.ravel()
    V = simd.lanes_of(X)
    if WIDE and N >= 4 * V and (N + 4 * V - 1) // (4 * V) * 4 <= (N + W - 1) // W * 3:
        W = 4 * V                                  # fewer vectors' work in all, overlaps included
    # columns outer: a tile's rows of X (K by 3 or 4 vectors) stay in the L1 cache for every row block
    for tn in range((N + W - 1) // W):
        n = _tile_starts(N, W, tn)
        for tm in range((M + 3) // 4):
            m = _tile_starts(M, 4, tm)
            if WIDE and W == 4 * V:
                tile4(A, x, N, n, y0, y, N, m * N + n, K, m, add)
            else:
                tile3(A, x, N, n, y0, y, N, m * N + n, K, m, add)


@njit(**JIT)
def _project_plain(A, X, Y0, Y, add):
    """:func:`project` as plain loops, for shapes smaller than one tile."""
    K, M = A.shape
    N = X.shape[1]
    for m in range(M):
        for n in range(N):
            Y[m, n] = Y0[m, n] if add else 0.0
        for k in range(K):
            a = A[k, m]
            for n in range(N):
                Y[m, n] += a * X[k, n]


@njit(inline="always", **JIT)
def _gram_tile(x, g, N, NV, k, m, out):
    """``out[k:k+4, m:m+3] = sum_n X[k+r, n] G[m+s, n]`` over the whole rows: twelve vectors of
    running sums over the first ``NV`` columns (whole vectors), then each one's lanes and the
    last ``N - NV`` columns added in order."""
    L = simd.lanes_of(x)
    a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = simd.zeros(x)
    r0, r1, r2, r3, s0, s1, s2 = k * N, (k + 1) * N, (k + 2) * N, (k + 3) * N, m * N, (m + 1) * N, (m + 2) * N
    for n in range(0, NV, L):
        x0, x1, x2, x3 = simd.load(x, r0 + n), simd.load(x, r1 + n), simd.load(x, r2 + n), simd.load(x, r3 + n)
        g0, g1, g2 = simd.load(g, s0 + n), simd.load(g, s1 + n), simd.load(g, s2 + n)
        a00, a01, a02 = simd.fma(x0, g0, a00), simd.fma(x0, g1, a01), simd.fma(x0, g2, a02)
        a10, a11, a12 = simd.fma(x1, g0, a10), simd.fma(x1, g1, a11), simd.fma(x1, g2, a12)
        a20, a21, a22 = simd.fma(x2, g0, a20), simd.fma(x2, g1, a21), simd.fma(x2, g2, a22)
        a30, a31, a32 = simd.fma(x3, g0, a30), simd.fma(x3, g1, a31), simd.fma(x3, g2, a32)
    sums = ((a00, a01, a02), (a10, a11, a12), (a20, a21, a22), (a30, a31, a32))
    for r in range(4):
        for s in range(3):
            total = simd.total(sums[r][s])
            for n in range(NV, N):
                total += x[(k + r) * N + n] * g[(m + s) * N + n]
            out[k + r, m + s] = total


@intrinsic
def _totals_into(typingctx, buf, vectors):
    """``buf[i] = total(vectors[i])`` for 16 vectors, each the tree of adds of :func:`simd.total`
    (upper half of the lanes onto the lower, and again), so the same bits; but two vectors'
    halves share each add: 15 vector adds for the 16 totals instead of 16 x log2(lanes)."""
    if not (isinstance(vectors, types.UniTuple) and len(vectors) == 16 and isinstance(vectors.dtype, simd.Vector)
            and isinstance(buf, types.Array) and buf.dtype == vectors.dtype.dtype):
        return None
    lanes = vectors.dtype.lanes

    def fold(builder, a, b, w):
        # each group of 2w lanes of a, then of b, to w lanes: low half + high half
        groups = [g * 2 * w for g in range(lanes // (2 * w))]
        low = [g + j for g in groups for j in range(w)]
        high = [g + w + j for g in groups for j in range(w)]
        index = lambda idx: ir.Constant(ir.VectorType(ir.IntType(32), lanes), idx + [i + lanes for i in idx])
        return builder.fadd(builder.shuffle_vector(a, b, index(low)), builder.shuffle_vector(a, b, index(high)))

    def codegen(context, builder, signature, args):
        vs = [builder.extract_value(args[1], i) for i in range(16)]
        w = lanes // 2
        while w >= 1:                 # pairs of neighbours: the totals come out in order
            vs = [fold(builder, vs[i], vs[i + 1], w) for i in range(0, len(vs), 2)]
            w //= 2
        data = context.make_array(buf)(context, builder, args[0]).data
        for i, v in enumerate(vs):    # 16 // lanes vectors of totals
            pointer = builder.bitcast(builder.gep(data, [ir.Constant(ir.IntType(64), i * lanes)]),
                                      v.type.as_pointer())
            builder.store(v, pointer, align=buf.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(buf, vectors), codegen


@njit(inline="always", **JIT)
def _gram_tile4(x, g, N, NV, k, m, out, buf):
    """``out[k:k+4, m:m+4]``, as :func:`_gram_tile` but sixteen running sums (32 registers), their
    lanes added by :func:`_totals_into`."""
    L = simd.lanes_of(x)
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = simd.zeros(x)
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = simd.zeros(x)
    r0, r1, r2, r3 = k * N, (k + 1) * N, (k + 2) * N, (k + 3) * N
    s0, s1, s2, s3 = m * N, (m + 1) * N, (m + 2) * N, (m + 3) * N
    for n in range(0, NV, L):
        x0, x1, x2, x3 = simd.load(x, r0 + n), simd.load(x, r1 + n), simd.load(x, r2 + n), simd.load(x, r3 + n)
        g0, g1, g2, g3 = simd.load(g, s0 + n), simd.load(g, s1 + n), simd.load(g, s2 + n), simd.load(g, s3 + n)
        a00, a01, a02, a03 = simd.fma(x0, g0, a00), simd.fma(x0, g1, a01), simd.fma(x0, g2, a02), simd.fma(x0, g3, a03)
        a10, a11, a12, a13 = simd.fma(x1, g0, a10), simd.fma(x1, g1, a11), simd.fma(x1, g2, a12), simd.fma(x1, g3, a13)
        a20, a21, a22, a23 = simd.fma(x2, g0, a20), simd.fma(x2, g1, a21), simd.fma(x2, g2, a22), simd.fma(x2, g3, a23)
        a30, a31, a32, a33 = simd.fma(x3, g0, a30), simd.fma(x3, g1, a31), simd.fma(x3, g2, a32), simd.fma(x3, g3, a33)
    _totals_into(buf, (a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33))
    for r in range(4):
        for s in range(4):
            total = buf[4 * r + s]
            for n in range(NV, N):
                total += x[(k + r) * N + n] * g[(m + s) * N + n]
            out[k + r, m + s] = total


@njit(**JIT)
def gram(X, G, out):
    """``out = X G^T``: ``out[k, m] = sum_n X[k, n] G[m, n]`` (a weight's gradient, ``h^T dy``).

    ``X`` (K, N) and ``G`` (M, N) C-contiguous; ``out`` (K, M) is overwritten.
    """
    K, N = X.shape
    M = G.shape[0]
    if K < 4 or M < 3:
        for k in range(K):
            for m in range(M):
                total = X[k, 0] * G[m, 0]
                for n in range(1, N):
                    total += X[k, n] * G[m, n]
                out[k, m] = total
        return
    L = simd.lanes_of(X)
    x, g = X.ravel(), G.ravel()
    NV = N - N % L
    if WIDE and M >= 4:
        buf = np.empty(16, X.dtype)
        for tk in range((K + 3) // 4):
            for tm in range((M + 3) // 4):
                _gram_tile4(x, g, N, NV, _tile_starts(K, 4, tk), _tile_starts(M, 4, tm), out, buf)
        return
    for tk in range((K + 3) // 4):
        for tm in range((M + 2) // 3):
            _gram_tile(x, g, N, NV, _tile_starts(K, 4, tk), _tile_starts(M, 3, tm), out)
