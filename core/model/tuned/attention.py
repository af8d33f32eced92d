"""The multi-head attention core of the compiled steps (between the packed QKV projection and W_O)."""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit
from numba.extending import intrinsic

from core.kernels.tuned import simd
from core.kernels.tuned.fastexp import fast_exp
from core.model.tuned import JIT
from core.model.tuned.products import WIDE


# A SIMD vector holds one position of `lanes` sequences (the chunk's sequences are padded to whole
# vectors), so the attention of all of them runs at once; columns are ordered so that one vector
# of sequences has its own T x lanes columns (:func:`column`), and its attention (Q, K, V, weights,
# about 20 kB at T = 16) stays in the L1 cache. Loops over the lanes, written as plain loops, are
# one vector long: LLVM's set-up for each (alias checks, the tail) would cost more than the
# arithmetic, so these kernels use the vectors directly.
@intrinsic
def _maximum(typingctx, a, b):
    """``a if a > b else b`` lane by lane (a NaN in ``a`` keeps ``b``)."""
    if not (isinstance(a, simd.Vector) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return a(a, b), codegen


@intrinsic
def _reciprocal(typingctx, a):
    """``1 / a`` lane by lane, one correctly rounded division (as the scalar ``1.0 / x`` in float64
    rounded to float32: the same bits), instead of a scalar loop over the lanes."""
    if not isinstance(a, simd.Vector):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(ir.Constant(args[0].type, [1.0] * a.lanes), args[0])

    return a(a), codegen


@njit(**JIT)
def _mul(a, b, like):
    """``a * b`` lane by lane (one rounding, as ``fma(a, b, 0)``)."""
    return simd.fma(a, b, simd.zeros(like))


@njit(inline="always", **JIT)
def _dot8(w, wo, ws, y, yo, yr, yt, n, like):
    """Eight sums of products of vectors, for r = 0..7: ``sum_{t < n} w[wo + t ws] * y[yo + r yr + t yt]``.

    Eight independent chains of fused multiply-adds sharing each load of ``w``: a chain alone
    waits on its own latency at every step, and eight keep both of the core's FMA units busy.
    """
    o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = simd.zeros(like)
    for t in range(n):
        u, at = simd.load(w, wo + t * ws), yo + t * yt
        o0 = simd.fma(u, simd.load(y, at), o0)
        o1 = simd.fma(u, simd.load(y, at + yr), o1)
        o2 = simd.fma(u, simd.load(y, at + 2 * yr), o2)
        o3 = simd.fma(u, simd.load(y, at + 3 * yr), o3)
        o4 = simd.fma(u, simd.load(y, at + 4 * yr), o4)
        o5 = simd.fma(u, simd.load(y, at + 5 * yr), o5)
        o6 = simd.fma(u, simd.load(y, at + 6 * yr), o6)
        o7 = simd.fma(u, simd.load(y, at + 7 * yr), o7)
    return o0, o1, o2, o3, o4, o5, o6, o7


@njit(inline="always", **JIT)
def _dot1(w, wo, ws, y, yo, yt, n, like):
    """:func:`_dot8` for one r: ``sum_{t < n} w[wo + t ws] * y[yo + t yt]``."""
    o = simd.zeros(like)
    for t in range(n):
        o = simd.fma(simd.load(w, wo + t * ws), simd.load(y, yo + t * yt), o)
    return o


@njit(inline="always", **JIT)
def _dots_into(out, oo, orr, w, wo, ws, y, yo, yr, yt, n, m, like):
    """``out[oo + r orr] = sum_{t < n} w[wo + t ws] * y[yo + r yr + t yt]`` for r = 0..m-1 (vectors),
    eight at a time."""
    r = 0
    while r + 8 <= m:
        o0, o1, o2, o3, o4, o5, o6, o7 = _dot8(w, wo, ws, y, yo + r * yr, yr, yt, n, like)
        at = oo + r * orr
        simd.store(out, at, o0), simd.store(out, at + orr, o1)
        simd.store(out, at + 2 * orr, o2), simd.store(out, at + 3 * orr, o3)
        simd.store(out, at + 4 * orr, o4), simd.store(out, at + 5 * orr, o5)
        simd.store(out, at + 6 * orr, o6), simd.store(out, at + 7 * orr, o7)
        r += 8
    while r < m:
        simd.store(out, oo + r * orr, _dot1(w, wo, ws, y, yo + r * yr, yt, n, like))
        r += 1


@njit(inline="always", **JIT)
def _dot8x2(w, wo, wo2, ws, y, yo, yr, yt, n, like):
    """:func:`_dot8` for two ``w`` at once (offsets ``wo``, ``wo2``): each load of ``y`` feeds two
    multiply-adds, where :func:`_dot8` needs nine loads for eight (sixteen chains, 32 registers)."""
    o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = simd.zeros(like)
    p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = simd.zeros(like)
    for t in range(n):
        u, u2, at = simd.load(w, wo + t * ws), simd.load(w, wo2 + t * ws), yo + t * yt
        z = simd.load(y, at)
        o0, p0 = simd.fma(u, z, o0), simd.fma(u2, z, p0)
        z = simd.load(y, at + yr)
        o1, p1 = simd.fma(u, z, o1), simd.fma(u2, z, p1)
        z = simd.load(y, at + 2 * yr)
        o2, p2 = simd.fma(u, z, o2), simd.fma(u2, z, p2)
        z = simd.load(y, at + 3 * yr)
        o3, p3 = simd.fma(u, z, o3), simd.fma(u2, z, p3)
        z = simd.load(y, at + 4 * yr)
        o4, p4 = simd.fma(u, z, o4), simd.fma(u2, z, p4)
        z = simd.load(y, at + 5 * yr)
        o5, p5 = simd.fma(u, z, o5), simd.fma(u2, z, p5)
        z = simd.load(y, at + 6 * yr)
        o6, p6 = simd.fma(u, z, o6), simd.fma(u2, z, p6)
        z = simd.load(y, at + 7 * yr)
        o7, p7 = simd.fma(u, z, o7), simd.fma(u2, z, p7)
    return (o0, o1, o2, o3, o4, o5, o6, o7), (p0, p1, p2, p3, p4, p5, p6, p7)


@njit(inline="always", **JIT)
def _store8(out, at, orr, o):
    """``out[at + r orr] = o[r]`` for the eight vectors ``o``."""
    simd.store(out, at, o[0]), simd.store(out, at + orr, o[1])
    simd.store(out, at + 2 * orr, o[2]), simd.store(out, at + 3 * orr, o[3])
    simd.store(out, at + 4 * orr, o[4]), simd.store(out, at + 5 * orr, o[5])
    simd.store(out, at + 6 * orr, o[6]), simd.store(out, at + 7 * orr, o[7])


@njit(inline="always", **JIT)
def _dots_rows(count, out, oo, oi, orr, w, wo, wi, ws, y, yo, yr, yt, n, m, like):
    """:func:`_dots_into` for ``count`` rows i (``out`` at ``oo + i oi``, ``w`` at ``wo + i wi``)
    against the same ``y``: with 32 registers two rows at a time, sharing the loads of ``y``
    (each output the same chain of multiply-adds, so the same bits)."""
    i = 0
    while WIDE and i + 2 <= count:
        r = 0
        while r + 8 <= m:
            o, o2 = _dot8x2(w, wo + i * wi, wo + (i + 1) * wi, ws, y, yo + r * yr, yr, yt, n, like)
            _store8(out, oo + i * oi + r * orr, orr, o)
            _store8(out, oo + (i + 1) * oi + r * orr, orr, o2)
            r += 8
        while r < m:
            for j in range(i, i + 2):
                simd.store(out, oo + j * oi + r * orr, _dot1(w, wo + j * wi, ws, y, yo + r * yr, yt, n, like))
            r += 1
        i += 2
    while i < count:
        _dots_into(out, oo + i * oi, orr, w, wo + i * wi, ws, y, yo, yr, yt, n, m, like)
        i += 1


@njit(inline="always", **JIT)
def _head_block(h, v, q_row, k_row, v_row, dk, Bv, Tq, L, Nq, Nk, TL):
    """Where head ``h`` of vector ``v`` starts: its query, key and value rows at this vector's
    columns (``q0`` in ``xq``, ``k0`` and ``v0`` in ``xkv``), its output rows (``o0`` in ``ctx`` or
    ``dctx``), and its block of ``P``."""
    q0 = (q_row + h * dk) * Nq + v * Tq * L
    k0, v0 = (k_row + h * dk) * Nk + v * TL, (v_row + h * dk) * Nk + v * TL
    o0 = h * dk * Nq + v * Tq * L
    block = (h * Bv + v) * Tq * TL
    return q0, k0, v0, o0, block


@njit(**JIT)
def attention_forward(xq, q_row, xkv, k_row, v_row, causal, P, ctx):
    """Per-head scaled dot-product attention on a chunk, a vector of sequences at a time.

    Queries are rows ``q_row:q_row+d`` of ``xq`` (rows, Nq); keys and values rows ``k_row:k_row+d``
    and ``v_row:v_row+d`` of ``xkv`` (rows, Nk), biases included, columns in :func:`column` order
    (Nq = Tq Bp, Nk = Tk Bp). Self-attention passes the packed ``qkv`` (3d, N) twice, with rows 0,
    d and 2d; cross-attention the decoder's queries and the encoder's keys and values. Writes
    ``P`` (H, Bv, Tq, Tk, lanes), ``P[h, v, i, j, l] = softmax_j(q_i . k_j / sqrt(d_k))`` of sequence
    ``v lanes + l`` (``causal``: keys ``j > i`` get weight exactly 0), and the heads' outputs,
    concatenated, ``ctx`` (d, Nq): ``ctx[h d_k + c, (i)] = sum_j P[h, i, j] v_j[c]``.
    """
    H, Bv, Tq, Tk = P.shape[0], P.shape[1], P.shape[2], P.shape[3]
    Nq, Nk = xq.shape[1], xkv.shape[1]
    dk = ctx.shape[0] // H
    L = simd.lanes_of(xq)
    TL = Tk * L                                  # one query's block of P
    x, y, p, out = xq.ravel(), xkv.ravel(), P.ravel(), ctx.ravel()
    scale = simd.splat(1.0 / math.sqrt(dk), xq)
    minus_one = simd.splat(-1.0, xq)
    masked = simd.splat(-np.inf, xq)
    for h in range(H):
        for v in range(Bv):
            q0, k0, v0, o0, block = _head_block(h, v, q_row, k_row, v_row, dk, Bv, Tq, L, Nq, Nk, TL)
            # 1. scores s_j = q_i . k_j / sqrt(d_k) of every visible key j, minus their maximum. Causal:
            # query i sees keys j <= i, the first min(i + 1, Tk), as core.masks.causal defines it (the
            # one definition; an index bound here, not a mask to add: tests/test_masks.py holds the two equal)
            if causal:
                for i in range(Tq):
                    _dots_into(p, block + i * TL, L, x, q0 + i * L, Nq, y, k0, L, Nk, dk, min(i + 1, Tk), xq)
            else:
                _dots_rows(Tq, p, block, TL, L, x, q0, L, Nq, y, k0, L, Nk, dk, Tk, xq)
            for i in range(Tq):
                row = block + i * TL                                     # P[h, v, i]: (Tk, lanes)
                live = min(i + 1, Tk) if causal else Tk                  # keys this query may see
                top = simd.splat(-np.inf, xq)
                for j in range(live):
                    s = _mul(simd.load(p, row + j * L), scale, xq)
                    simd.store(p, row + j * L, s)
                    top = _maximum(s, top)
                shift = _mul(top, minus_one, xq)
                for j in range(live):
                    simd.store(p, row + j * L, simd.add(simd.load(p, row + j * L), shift))
                for j in range(live, Tk):
                    simd.store(p, row + j * L, masked)                   # exp(-inf) = 0 exactly
            # 2. exponentials of the whole block, every query at once (one long loop from 0 over a
            # slice, which LLVM vectorises; a loop per query spent a third of its time starting)
            weights = p[block:block + Tq * TL]
            for n in range(Tq * TL):
                weights[n] = fast_exp(weights[n])
            for i in range(Tq):
                row = block + i * TL
                # 3. divide by the sum over the keys
                total = simd.zeros(xq)
                for j in range(Tk):
                    total = simd.add(total, simd.load(p, row + j * L))
                inverse = _reciprocal(total)
                for j in range(Tk):
                    simd.store(p, row + j * L, _mul(simd.load(p, row + j * L), inverse, xq))
            # 4. the head's output for each query i: o_c = sum_j P_ij v_j[c]
            _dots_rows(Tq, out, o0, L, Nq, p, block, TL, L, y, v0, Nk, L, Tk, dk, xq)


@njit(**JIT)
def attention_backward(xq, q_row, xkv, k_row, v_row, P, dctx, dxq, dxkv):
    """Backward of :func:`attention_forward`: the gradients of the queries into rows
    ``q_row:q_row+d`` of ``dxq``, of the keys and values into rows ``k_row:``, ``v_row:`` of
    ``dxkv`` (laid out as ``xq`` and ``xkv``; self-attention passes ``dqkv`` twice), overwritten.

    With ``S = Q K^T / sqrt(d_k)``, ``P = softmax(S)``, ``O = P V``: ``dP = dO V^T``,
    ``dS = P * (dP - rowsum(dP * P))``, then ``dQ = dS K / sqrt(d_k)``, ``dK = dS^T Q / sqrt(d_k)``,
    ``dV = P^T dO``. Each output is one sum per entry (no read-modify-write). A causal mask needs
    nothing here: its weights are 0, so are their ``dS``.
    """
    H, Bv, Tq, Tk = P.shape[0], P.shape[1], P.shape[2], P.shape[3]
    Nq, Nk = xq.shape[1], xkv.shape[1]
    dk = dctx.shape[0] // H
    L = simd.lanes_of(xq)
    TL = Tk * L
    x, y, p, g, dx, dy = xq.ravel(), xkv.ravel(), P.ravel(), dctx.ravel(), dxq.ravel(), dxkv.ravel()
    scale = simd.splat(1.0 / math.sqrt(dk), xq)
    minus_one = simd.splat(-1.0, xq)
    dS = np.empty(Tq * TL, xq.dtype)                # dS of one (head, vector), laid out as its P block
    for h in range(H):
        for v in range(Bv):
            q0, k0, v0, o0, block = _head_block(h, v, q_row, k_row, v_row, dk, Bv, Tq, L, Nq, Nk, TL)
            # 1. dP_ij = dO_i . v_j
            _dots_rows(Tq, dS, 0, TL, L, g, o0, L, Nq, y, v0, L, Nk, dk, Tk, xq)
            for i in range(Tq):
                row = i * TL
                # 2. through the softmax and the 1 / sqrt(d_k): dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij)
                rowdot = _dot1(p, block + row, L, dS, row, L, Tk, xq)
                minus_rowdot = _mul(rowdot, minus_one, xq)
                for j in range(Tk):
                    at = row + j * L
                    diff = simd.add(simd.load(dS, at), minus_rowdot)
                    simd.store(dS, at, _mul(_mul(simd.load(p, block + at), diff, xq), scale, xq))
            for job in range(3):
                # 3. dq_t = sum_j dS_tj k_j; 4. dk_t = sum_i dS_it q_i; 5. dv_t = sum_i P_it dO_i
                # (one call site: each copy of the inlined loops costs seconds of compile time)
                if job == 0:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dx, q0, Tq, Nq, dS, 0, L, y, k0, Nk, Tk
                elif job == 1:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dy, k0, Tk, Nk, dS, 0, TL, x, q0, Nq, Tq
                else:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dy, v0, Tk, Nk, p, block, TL, g, o0, Nq, Tq
                # job 0 reads row t of dS (stride L over keys), jobs 1 and 2 column t (stride TL)
                _dots_rows(n_out, d_out, out, L, N_out, w, wo, TL if job == 0 else L, ws, src, so, sr, L, n, dk, xq)
