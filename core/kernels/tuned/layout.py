"""How the tuned CPU kernels lay out their data: cache-line-aligned scratch, keys transposed into
panels and values padded to whole SIMD vectors, the rows of a mask, the ranges of keys a mask leaves
live, and the work units the parallel builds share out. Each helper is ``@njit(inline="always")``:
compiled into the kernels of ``core/kernels/tuned/cpu.py`` (with the tiles of ``tiles.py``), never
called from Python.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from core.kernels.tuned import simd, target
from core.kernels.tuned.borrow import borrowed

# Reassociation lets LLVM vectorise the dot products; no flag here touches inf/NaN semantics,
# which the -inf masks rely on (so no 'nnan', 'ninf' or plain fastmath=True).
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_jit = dict(cache=True, fastmath=FASTMATH)

# Whether the compile target has the registers for the 4 x 4 tile (see target.py): a constant of the
# compiled code, so a build for 16 registers leaves that tile out. Compiled in there but never run,
# its 21 live vectors had still cost the AVX2 build: in the copy of the work unit each kernel links
# in (the one the disk cache keeps), LLVM kept one running sum of the 4 x 2 tile on the stack, stored
# and reloaded at every step. 8 heads of T = 512 ran 35 % slower, of T = 64 70 % (AMD Zen 4).
WIDE_TILES = target.TILE_VECTORS == 4


# Vectors are read and written whole; one that straddles two 64-byte cache lines costs two
# accesses. NumPy and Numba align arrays to 16 bytes only, so the arrays the tiles stream through
# (laid-out keys and values, score and output scratch) start on a cache line; with their rows a
# whole number of vectors long, every vector then sits in one line. Unaligned, the scores ran at
# 140 GFLOP/s against 178 aligned (T = 512, d_k = 64, one core), depending on where malloc put them.
CACHE_LINE = 64


@njit(inline="always", **_jit)
def _aligned_empty(shape, like):
    """An empty array of ``shape`` (a tuple) and ``like``'s dtype whose data starts on a cache line."""
    n, per_line = 1, CACHE_LINE // like.itemsize
    for size in shape:
        n *= size
    buffer = np.empty(n + per_line, like.dtype)
    start = (-(buffer.ctypes.data // like.itemsize)) % per_line
    return buffer[start:start + n].reshape(shape)


@njit(inline="always", **_jit)
def _aligned_zeros(shape, like):
    """:func:`_aligned_empty`, filled with zeros."""
    x = _aligned_empty(shape, like)
    x[:] = 0.0
    return x


@njit(inline="always", **_jit)
def _wide(Kt, like):
    """Whether the keys ``Kt`` are laid out in panels four vectors wide (see :func:`_key_panels`),
    and so the tiles are 4 x 4; never in a build without the 4 x 4 tile, whose 4 x 2 tile then
    reads such panels two vectors at a time."""
    return WIDE_TILES and Kt.shape[-1] == 4 * simd.lanes_of(like)


@njit(inline="always", **_jit)
def _key_panels(K, W):
    """Room for the keys in panels of ``W`` keys (see :func:`_transpose_keys`), on a cache line."""
    B, H, Tk, dk = K.shape
    return _aligned_empty((B, H, (Tk + W - 1) // W, dk, W), K)


@njit(inline="always", **_jit)
def _padded_values(V):
    """Room for the value rows padded to whole vectors (see :func:`_pad_values`), on a cache line."""
    B, H, Tk, dv = V.shape
    return _aligned_empty((B, H, Tk, _round_up(dv, simd.lanes_of(V))), V)


@njit(inline="always", **_jit)
def _mask_row(mask, b, h, i):
    """The mask's row for query (b, h, i), honouring broadcast axes of length 1: (1,) or (Tk,).
    (Any array laid out per mask row, as the live ranges are, is read the same way.)"""
    return mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0, i if mask.shape[2] > 1 else 0]


@njit(inline="always", **_jit)
def _round_up(n, step):
    return (n + step - 1) // step * step


@njit(inline="always", **_jit)
def _transpose_keys(K, Kt, b, h):
    """``Kt[b, h, p, :, c] = K[b, h, p * W + c]`` (``W = Kt.shape[4]``, the tile's vectors): the keys cut
    into panels of ``W`` keys, each panel stored transposed, so that one SIMD vector holds one
    feature of several keys and a register tile (4 queries by one panel) reads its panel from
    start to end, ``d_k * W`` contiguous numbers, as a BLAS kernel reads its packed operand.
    The last panel is zero beyond the last key, so whole vectors may run past it.

    With one row of ``Kt`` per feature instead (``d_k`` rows as long as the keys), each step of the
    tile loaded from a different row: at T = 512, d_k = 64 the scores ran at 66 % of one core's
    sgemm against 89 % for ``A V``, whose value rows are read in order.

    Done once per head, before the work is split into blocks of queries (each block transposing
    for itself cost as much as its arithmetic). The views are borrowed (see borrow.py) and each
    panel's rows are written in order: a view per key, each with its reference count, had made
    this 1.6 to 10 times slower (8 heads of 64 keys, d_k = 16: 3.8 against 2.1 us).
    """
    K, Kt = borrowed(K), borrowed(Kt)
    keys, panels = K[b, h], Kt[b, h]
    Tk, W = keys.shape[0], panels.shape[2]
    for p in range(panels.shape[0]):
        panel, n = panels[p], min(W, Tk - p * W)
        block = keys[p * W:p * W + n]
        for d in range(keys.shape[1]):
            row = panel[d]
            for c in range(n):
                row[c] = block[c, d]
            _fill(row, n, W, 0.0)


@njit(inline="always", **_jit)
def _pad_values(V, Vp, b, h):
    """``Vp[b, h, j, :d_v] = V[b, h, j]``, zero beyond: value rows a whole number of vectors long
    (views borrowed, as in :func:`_transpose_keys`)."""
    V, Vp = borrowed(V), borrowed(Vp)
    values, padded = V[b, h], Vp[b, h]
    dv = values.shape[1]
    for j in range(values.shape[0]):
        row, v = padded[j], values[j]
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
def _live_keys(m, n):
    """``[lo, hi)``: the keys ``0 <= j < n`` outside which the mask row ``m`` is all -inf.

    A causal or padding mask leaves a contiguous run of live keys: scores, exps and the weighted
    sum only visit that run, which halves the work of causal attention.
    """
    if m.shape[0] == 1:                        # mask broadcast along keys
        return (0, n) if m[0] != -np.inf else (0, 0)
    # A whole pass with integer min/max (which LLVM vectorises) instead of scanning in from both
    # ends: a causal row's scan from the end stopped only after half the row, one key at a time.
    # Positions as int32, 16 to an AVX-512 vector where int64 fit 8: the ranges of a 512 x 512
    # causal mask in 49-52 us against 65-67.
    lo, hi = np.int32(n), np.int32(0)
    for j in range(np.int32(n)):
        live = m[j] != -np.inf
        lo = min(lo, j if live else np.int32(n))
        hi = max(hi, j + np.int32(1) if live else np.int32(0))
    return (lo, hi) if lo < hi else (np.int32(0), np.int32(0))


@njit(inline="always", **_jit)
def _live_ranges(mask, Tk):
    """``ranges[b, h, i] = (lo, hi, zero)`` for each row ``(b, h, i)`` the mask holds (its broadcast
    axes stay of length 1): the keys ``0 <= j < Tk`` outside which the row is all -inf (see
    :func:`_live_keys`; ``(0, 0)`` for a row with nothing live), and whether the row is exactly 0
    on all of them, as every row of a causal or padding mask is: such a row needs nothing added to
    the scores but -inf outside its own range (see :func:`_scores_group`).

    Found once per call, before the work is split, where each head had scanned the mask for itself
    and added it to its scores: a 512 x 512 causal mask (1 MiB) takes about 50 us to scan, and one
    head's fused attention at 512 keys about 470 us. 8 heads of causal T = 512 on one
    thread: 3.8-4.0 ms before, 3.4-3.5 ms with the ranges found once, 3.1-3.3 ms adding no zeros.
    """
    Bm, Hm, Tqm = mask.shape[0], mask.shape[1], mask.shape[2]
    ranges = np.empty((Bm, Hm, Tqm, 3), np.int64)
    for b in range(Bm):
        for h in range(Hm):
            for i in range(Tqm):
                row = mask[b, h, i]
                lo, hi = _live_keys(row, Tk)
                ranges[b, h, i, 0], ranges[b, h, i, 1] = lo, hi
                ranges[b, h, i, 2] = row.shape[0] > 1 and _all_zero(row[lo:hi])
    return ranges


@njit(inline="always", **_jit)
def _all_zero(x):
    """Whether every number of ``x`` is 0 (one pass without an early exit, which vectorises)."""
    zero = True
    for j in range(x.shape[0]):
        zero &= x[j] == 0.0
    return zero


@njit(inline="always", **_jit)
def _tile_keys(ranges, b, h, i, k0, n):
    """The live range of query (b, h, i) inside the tile of keys ``k0 .. k0+n``, counted from ``k0``."""
    live = _mask_row(ranges, b, h, i)
    lo, hi = max(live[0] - k0, 0), min(live[1] - k0, n)
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
def _panel_keys(Kt):
    """Keys the panels of ``Kt`` hold: the key count rounded up to a whole panel."""
    return Kt.shape[2] * Kt.shape[4]


@njit(inline="always", **_jit)
def _unit(u, H, n_blocks, Tq, block):
    """Work unit ``u`` -> (batch, head, first query, end query): one block of queries of one head."""
    b, h, qb = u // (H * n_blocks), (u // n_blocks) % H, u % n_blocks
    return b, h, qb * block, min(qb * block + block, Tq)
