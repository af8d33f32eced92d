"""Numba CPU kernels (``@njit``) for attention, masking, multi-head projection and positional encoding.

Host drivers here and in the lesson kernels (``core/kernels/cpu.py``, ``core/kernels/gpu.py``) share
names and signatures; ``core/kernels/dispatch.py`` picks one. Drivers take validated, C-contiguous arrays of one float dtype and return new arrays:

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
from core.readiness import can_run
# The building blocks live in layout.py (aligned scratch, key panels, padded values, live-key
# ranges, work units) and tiles.py (register tiles, softmax pieces).
from core.kernels.tuned.layout import (_aligned_empty, _aligned_zeros, _copy, _fill, _jit, _key_panels, _live_ranges,
                                       _pad_values, _padded_values, _panel_keys, _round_up, _transpose_keys, _unit,
                                       _wide)
from core.kernels.tuned.tiles import _online_rescale_group, _scores_group, _softmax_group, _weighted_sum_tile

# Below this many multiply-adds a call runs serially (tunable, and patched by tests).
PARALLEL_MIN_WORK = 1 << 16
# Queries handled together by one parallel work unit when a unit is not a whole head (see
# _query_block; 16 to 64 measured alike at T = 64 and 128), and keys per tile in the fused kernel
# (chosen with the register tile, from the compile target, in target.py).
QUERY_BLOCK = 32
KEY_TILE = target.KEY_BLOCK

# The loops of one work unit (a block of queries of one head) are an ordinary compiled function,
# shared by a kernel's serial and parallel builds: compiled once and cached, instead of once per
# build. Everything it calls is inlined into it (inline="always"): calls that pass a dozen arrays
# each (seven machine words per 1-D array) had cost a fifth to a third of the time at 64 keys.


# --- kernels: one function per operation, serial and parallel builds ----------------------
# The parallel loop runs over work units: whole heads, each laying out its own keys (and values)
# for the SIMD tiles first, or (batch, head, block of queries) after one parallel pass has laid
# out every head's (see _query_block for which). Each unit's loops run in a function of their own
# that borrows its array arguments (see core/kernels/tuned/borrow.py): the unit allocates its scratch, the
# function uses it without reference counting.


@njit(**_jit)
def _scores_unit(Q, Kt, mask, ranges, scale, b, h, i0, i1, S, Qs, S4):
    Q, Kt, mask, ranges, S = borrowed(Q), borrowed(Kt), borrowed(mask), borrowed(ranges), borrowed(S)
    Qs, S4 = borrowed(Qs), borrowed(S4)
    Tk = S.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        lo, hi = _scores_group(Q, Kt[b, h], mask, ranges, scale, b, h, i, n, 0, Tk, Qs, S4)
        for r in range(n):
            row = S[b, h, i + r]
            _copy(S4[r, lo:hi], row[lo:hi], hi - lo)
            _fill(row, 0, lo, -np.inf)
            _fill(row, hi, Tk, -np.inf)


def _scores_rows(Q, K, mask, scale, S, panel, block):
    B, H, Tq, Tk = S.shape
    Kt, ranges = _key_panels(K, panel), _live_ranges(mask, Tk)
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _transpose_keys(K, Kt, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _transpose_keys(K, Kt, b, h)
        _scores_unit(Q, Kt, mask, ranges, scale, b, h, i0, i1, S,
                     np.empty((4, Q.shape[3]), Q.dtype), _aligned_empty((4, _panel_keys(Kt)), Q))


@njit(**_jit)
def _weights_unit(Q, Kt, Vp, mask, ranges, scale, b, h, i0, i1, A, out, S, Qs, S4, O4):
    """Rows ``i0..i1`` of ``A = softmax(Q K^T * scale + M)``, four queries at a time (see
    :func:`_scores_tile`), and ``out = A V`` for them; the scores too into ``S``, unless it is
    empty (``(0, 0, 0, 0)``: the softmax then overwrites them in the scratch rows)."""
    Q, Kt, Vp, mask, A, out = borrowed(Q), borrowed(Kt), borrowed(Vp), borrowed(mask), borrowed(A), borrowed(out)
    ranges, S, Qs, S4, O4 = borrowed(ranges), borrowed(S), borrowed(Qs), borrowed(S4), borrowed(O4)
    Tk, dv = A.shape[3], out.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        lo, hi = _scores_group(Q, Kt[b, h], mask, ranges, scale, b, h, i, n, 0, Tk, Qs, S4)
        if S.shape[0] > 0:                     # kept: -inf outside the live keys, as _scores_unit writes them
            for r in range(n):
                row = S[b, h, i + r]
                _copy(S4[r, lo:hi], row[lo:hi], hi - lo)
                _fill(row, 0, lo, -np.inf)
                _fill(row, hi, Tk, -np.inf)
        _softmax_group(S4, lo, hi, n, A[b, h], i)
        for r in range(4):
            _fill(O4[r], 0, O4.shape[1], 0.0)
        # The weights for A V from the scratch rows, which stay in L1, not from A: at 8 heads of
        # 64 causal keys, 25-29 us against 29-40 us (it varied from one process to the next).
        last = n - 1                           # rows past n repeat the last one, into O4 only
        _weighted_sum_tile(S4[0], S4[min(1, last)], S4[min(2, last)], S4[min(3, last)],
                           Vp[b, h], 0, lo, hi, O4[0], O4[1], O4[2], O4[3], _wide(Kt, Q))
        for r in range(n):
            _copy(O4[r], out[b, h, i + r], dv)


def _attention_rows(Q, K, V, mask, scale, A, out, S, panel, block):
    B, H, Tq = A.shape[0], A.shape[1], A.shape[2]
    Kt, Vp, ranges = _key_panels(K, panel), _padded_values(V), _live_ranges(mask, K.shape[2])
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
        _weights_unit(Q, Kt, Vp, mask, ranges, scale, b, h, i0, i1, A, out, S,
                      np.empty((4, Q.shape[3]), Q.dtype), _aligned_empty((4, _panel_keys(Kt)), Q),
                      _aligned_empty((4, Vp.shape[3]), Q))


@njit(**_jit)
def _weighted_sum_unit(A, Vp, b, h, i0, i1, out, O4, wide):
    A, Vp, out, O4 = borrowed(A), borrowed(Vp), borrowed(out), borrowed(O4)
    Tk, dv = A.shape[3], out.shape[3]
    for i in range(i0, i1, 4):
        n = min(4, i1 - i)
        last = i + n - 1
        for r in range(4):
            _fill(O4[r], 0, O4.shape[1], 0.0)
        _weighted_sum_tile(A[b, h, i], A[b, h, min(i + 1, last)], A[b, h, min(i + 2, last)],
                           A[b, h, min(i + 3, last)], Vp[b, h], 0, 0, Tk, O4[0], O4[1], O4[2], O4[3], wide)
        for r in range(n):
            _copy(O4[r], out[b, h, i + r], dv)


def _weighted_sum_rows(A, V, out, block, wide):
    B, H, Tq, Tk = A.shape
    Vp = _padded_values(V)
    n_blocks = (Tq + block - 1) // block
    if n_blocks > 1:
        for u in prange(B * H):
            _pad_values(V, Vp, u // H, u % H)
    for u in prange(B * H * n_blocks):
        b, h, i0, i1 = _unit(u, H, n_blocks, Tq, block)
        if n_blocks == 1:
            _pad_values(V, Vp, b, h)
        _weighted_sum_unit(A, Vp, b, h, i0, i1, out, _aligned_empty((4, Vp.shape[3]), A), wide)


@njit(**_jit)
def _fused_unit(Q, Kt, Vp, mask, ranges, scale, b, h, i0, i1, out, key_tile, Qs, S4, m, l, acc):
    """Queries ``i0..i1`` of the fused kernel: per query the running max ``m``, normaliser ``l`` and
    unnormalised output ``acc`` over the key tiles; ``acc`` has three spare rows past the block's
    for the repeated rows of a last group of fewer than four queries."""
    Q, Kt, Vp, mask, out = borrowed(Q), borrowed(Kt), borrowed(Vp), borrowed(mask), borrowed(out)
    ranges, Qs, S4, m, l, acc = borrowed(ranges), borrowed(Qs), borrowed(S4), borrowed(m), borrowed(l), borrowed(acc)
    Tk, dv = Vp.shape[2], out.shape[3]
    for j0 in range(0, Tk, key_tile):
        n_keys = min(key_tile, Tk - j0)
        for i in range(i0, i1, 4):
            n, r = min(4, i1 - i), i - i0
            lo, hi = _scores_group(Q, Kt[b, h], mask, ranges, scale, b, h, i, n, j0, n_keys, Qs, S4)
            _online_rescale_group(S4, lo, hi, r, n, m, l, acc)
            _weighted_sum_tile(S4[0], S4[1], S4[2], S4[3], Vp[b, h], j0, lo, hi,
                               acc[r], acc[r + 1], acc[r + 2], acc[r + 3], _wide(Kt, Q))
    for i in range(i0, i1):
        r = i - i0
        # In the row's dtype: 1.0 / l[r] would be float64, and each float32 product a conversion.
        inv = l.dtype.type(1) / l[r] if l[r] > 0 else l.dtype.type(0)   # nothing allowed: zeros, never NaN
        for d in range(dv):
            out[b, h, i, d] = acc[r, d] * inv


def _fused_blocks(Q, K, V, mask, scale, out, panel, block, key_tile):
    """Online softmax over key tiles, FlashAttention-style: per query keep the running max ``m``,
    the running normaliser ``l`` and the unnormalised output ``acc``; rescale both by
    ``exp(m_old - m_new)`` when a tile raises the max. Extra memory: the laid-out keys and values
    (``Kt``, ``Vp``: about the size of K and V) and, per unit, O(key_tile + block * d_v); never
    (Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    Kt, Vp, ranges = _key_panels(K, panel), _padded_values(V), _live_ranges(mask, K.shape[2])
    key_tile = _round_up(max(key_tile, 1), panel)         # whole panels of keys (see _scores_tile)
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
        _fused_unit(Q, Kt, Vp, mask, ranges, scale, b, h, i0, i1, out, key_tile,
                    np.empty((4, dk), Q.dtype), _aligned_empty((4, _round_up(key_tile, simd.lanes_of(Q))), Q),
                    np.full(i1 - i0, -np.inf, Q.dtype), np.zeros(i1 - i0, Q.dtype),
                    _aligned_zeros((i1 - i0 + 3, Vp.shape[3]), Q))


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


def _panel(dtype) -> int:
    """Keys per panel of the laid-out keys: the register tile's width, ``TILE_VECTORS`` vectors
    (read at each call, so that tests can run either tile in a build for AVX-512, and panels of
    either width in any build)."""
    return target.TILE_VECTORS * simd.lanes(np.dtype(dtype))


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` -> (B, H, Tq, Tk)."""
    B, H, Tq, dk = Q.shape
    S = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    work = S.size * dk
    _pick(_scores_kernel, work)(Q, K, mask, Q.dtype.type(scale), S, _panel(Q.dtype), _query_block(B, H, Tq, work))
    return S


def weighted_sum(A, V):
    """``out = A V`` -> (B, H, Tq, d_v)."""
    out = np.empty(A.shape[:3] + (V.shape[3],), dtype=V.dtype)
    work = A.size * V.shape[3]
    _pick(_weighted_sum_kernel, work)(A, V, out, _query_block(*A.shape[:3], work), target.TILE_VECTORS == 4)
    return out


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` and ``out = A V`` in one pass over each row."""
    out, A, _ = _attention(Q, K, V, mask, scale, keep_scores=False)
    return out, A


def attention_with_scores(Q, K, V, mask, scale):
    """:func:`attention_with_weights`, and the scores ``S = Q K^T * scale + M`` it took the softmax of,
    kept on the way -> (out, A, S)."""
    return _attention(Q, K, V, mask, scale, keep_scores=True)


def _attention(Q, K, V, mask, scale, keep_scores: bool):
    B, H, Tq, dk = Q.shape
    A = np.empty((B, H, Tq, K.shape[2]), dtype=Q.dtype)
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    S = np.empty(A.shape if keep_scores else (0, 0, 0, 0), dtype=Q.dtype)
    work = A.size * (dk + V.shape[3] + 8)
    _pick(_attention_kernel, work)(Q, K, V, mask, Q.dtype.type(scale), A, out, S, _panel(Q.dtype),
                                   _query_block(B, H, Tq, work))
    return out, A, S


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + M) V`` without materialising the (Tq, Tk) weights."""
    kernel, args = _fused_call(Q, K, V, mask, scale)
    kernel(*args)
    return args[5]


def fused_attention_if_loaded(Q, K, V, mask, scale):
    """:func:`fused_attention`, or None while its kernel for these operands is not loaded (it would
    compile on this thread: :func:`core.readiness.can_run`)."""
    kernel, args = _fused_call(Q, K, V, mask, scale)
    if not can_run(kernel, *args):
        return None
    kernel(*args)
    return args[5]


def _fused_call(Q, K, V, mask, scale):
    """The fused kernel's build for these operands and its arguments (the output sixth, fresh)."""
    B, H, Tq, dk = Q.shape
    out = np.empty((B, H, Tq, V.shape[3]), dtype=V.dtype)
    work = B * H * Tq * K.shape[2] * (dk + V.shape[3] + 8)
    return _pick(_fused_kernel, work), (Q, K, V, mask, Q.dtype.type(scale), out, _panel(Q.dtype),
                                        _query_block(B, H, Tq, work), KEY_TILE)


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
