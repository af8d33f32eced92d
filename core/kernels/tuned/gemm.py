"""Our own matrix product ``y = act(x W + b) + residual`` for the real models' linear layers.

A library product (NumPy's BLAS) is handed ``W`` afresh at every call and re-packs it each time.
A model's weights are known when it loads, so :func:`pack` lays each one out once in the order the
register tile reads it, and :func:`matmul` multiplies activations by the packed weight:

- **register tile**: four rows of ``x`` by ``TILE_VECTORS`` SIMD vectors of columns. The running
  sums (16 with AVX-512's 32 registers, 12 with AVX2's 16) stay in registers while a loop over
  ``k`` feeds them: each step loads ``TILE_VECTORS`` vectors of ``W``'s row ``k`` and broadcasts four
  numbers of ``x``;
- **packed panels**: ``W`` (K, N) becomes ``panels`` (P, K, width), one tile's columns for every
  ``k`` side by side. The tile then reads memory in order, where ``W``'s own rows lie ``N`` numbers
  apart (at 2048 x 2048 each ``k`` was a new page: a quarter of the speed);
- **cache blocking**: for a long ``K`` and many rows, ``K`` in chunks whose panel stays in the L2 cache;
- **both cores**: the tiles are shared out among Numba's threads (``prange``). A tile is computed
  by one thread, its sums in the same order whatever the thread count, so the numbers do not depend
  on it;
- **fused epilogue**: the bias, the activation (GELU, exact or its tanh form; SiLU) and a residual
  are applied to a tile while it is still in the L1 cache, instead of a pass over the whole output each;
- **joined weights**: several weights that multiply the same ``x`` (a layer's query, key and value
  projections) go through one product, their tiles shared out among the threads together.

The readable twin, the loops these compute, is :func:`core.kernels.matmul.matmul_kernel`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from core.kernels.tuned import simd
from core.kernels.tuned.fastexp import EXP_MAX, gelu_erf, gelu_tanh, silu
from core.kernels.tuned.target import REGISTERS, VECTOR_BYTES
from core.readiness import can_run

JIT = dict(cache=True, nogil=True, error_model="numpy")
TILE_ROWS = 4
TILE_VECTORS = 4 if REGISTERS >= 32 else 3       # 16 or 12 running sums + the loads + one broadcast
ACTIVATIONS = {"none": 0, "gelu_tanh": 1, "silu": 2, "gelu_erf": 3}     # gelu_erf: float32 only
GELU_TANH_C = float(np.sqrt(2.0 / np.pi))


# ----------------------------------------------------------------------------------------------
# the register tiles: Y[4 rows, V vectors] = (Y0 if add) + sum_k A[k, m + r] X[k, vectors]
# ----------------------------------------------------------------------------------------------
@njit(inline="always", **JIT)
def tile3(A, x, x_row, xo, y0, y, y_row, yo, K, m, add):
    """Four rows by three vectors: ``y[yo + r y_row + (0..3L)] = (y0 there if add) + sum_k A[k, m+r]
    x[xo + k x_row + (0..3L)]``, ``x``, ``y0``, ``y`` flat. Each step of ``k`` loads three vectors of
    ``x``'s row ``k``, broadcasts four numbers of ``A`` and does twelve fused multiply-adds."""
    L = simd.lanes_of(x)
    if add:
        o = yo
        a00, a01, a02 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += y_row
        a10, a11, a12 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += y_row
        a20, a21, a22 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += y_row
        a30, a31, a32 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
    else:
        a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = simd.zeros(x)
    for k in range(K):
        i = xo + k * x_row
        u0, u1, u2 = simd.load(x, i), simd.load(x, i + L), simd.load(x, i + 2 * L)
        w = simd.splat(A[k, m], x)
        a00, a01, a02 = simd.fma(w, u0, a00), simd.fma(w, u1, a01), simd.fma(w, u2, a02)
        w = simd.splat(A[k, m + 1], x)
        a10, a11, a12 = simd.fma(w, u0, a10), simd.fma(w, u1, a11), simd.fma(w, u2, a12)
        w = simd.splat(A[k, m + 2], x)
        a20, a21, a22 = simd.fma(w, u0, a20), simd.fma(w, u1, a21), simd.fma(w, u2, a22)
        w = simd.splat(A[k, m + 3], x)
        a30, a31, a32 = simd.fma(w, u0, a30), simd.fma(w, u1, a31), simd.fma(w, u2, a32)
    o = yo
    simd.store(y, o, a00), simd.store(y, o + L, a01), simd.store(y, o + 2 * L, a02)
    o += y_row
    simd.store(y, o, a10), simd.store(y, o + L, a11), simd.store(y, o + 2 * L, a12)
    o += y_row
    simd.store(y, o, a20), simd.store(y, o + L, a21), simd.store(y, o + 2 * L, a22)
    o += y_row
    simd.store(y, o, a30), simd.store(y, o + L, a31), simd.store(y, o + 2 * L, a32)


@njit(inline="always", **JIT)
def tile4(A, x, x_row, xo, y0, y, y_row, yo, K, m, add):
    """:func:`tile3` four vectors wide (sixteen running sums: AVX-512's 32 registers hold them)."""
    L = simd.lanes_of(x)
    if add:
        o = yo
        a00, a01, a02, a03 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L), simd.load(y0, o + 3 * L)
        o += y_row
        a10, a11, a12, a13 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L), simd.load(y0, o + 3 * L)
        o += y_row
        a20, a21, a22, a23 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L), simd.load(y0, o + 3 * L)
        o += y_row
        a30, a31, a32, a33 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L), simd.load(y0, o + 3 * L)
    else:
        a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = simd.zeros(x)
        a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = simd.zeros(x)
    for k in range(K):
        i = xo + k * x_row
        u0, u1, u2, u3 = simd.load(x, i), simd.load(x, i + L), simd.load(x, i + 2 * L), simd.load(x, i + 3 * L)
        w = simd.splat(A[k, m], x)
        a00, a01, a02, a03 = simd.fma(w, u0, a00), simd.fma(w, u1, a01), simd.fma(w, u2, a02), simd.fma(w, u3, a03)
        w = simd.splat(A[k, m + 1], x)
        a10, a11, a12, a13 = simd.fma(w, u0, a10), simd.fma(w, u1, a11), simd.fma(w, u2, a12), simd.fma(w, u3, a13)
        w = simd.splat(A[k, m + 2], x)
        a20, a21, a22, a23 = simd.fma(w, u0, a20), simd.fma(w, u1, a21), simd.fma(w, u2, a22), simd.fma(w, u3, a23)
        w = simd.splat(A[k, m + 3], x)
        a30, a31, a32, a33 = simd.fma(w, u0, a30), simd.fma(w, u1, a31), simd.fma(w, u2, a32), simd.fma(w, u3, a33)
    o = yo
    simd.store(y, o, a00), simd.store(y, o + L, a01), simd.store(y, o + 2 * L, a02), simd.store(y, o + 3 * L, a03)
    o += y_row
    simd.store(y, o, a10), simd.store(y, o + L, a11), simd.store(y, o + 2 * L, a12), simd.store(y, o + 3 * L, a13)
    o += y_row
    simd.store(y, o, a20), simd.store(y, o + L, a21), simd.store(y, o + 2 * L, a22), simd.store(y, o + 3 * L, a23)
    o += y_row
    simd.store(y, o, a30), simd.store(y, o + L, a31), simd.store(y, o + 2 * L, a32), simd.store(y, o + 3 * L, a33)


# ----------------------------------------------------------------------------------------------
# packed weights
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackedWeight:
    """A weight ``W`` (K, N) laid out for the tile: ``panels[p, k, j] = W[k, p * width + j]``, the
    last panel padded with zeros. ``shape`` and ``dtype`` are ``W``'s."""
    panels: np.ndarray
    shape: tuple[int, int]

    @property
    def dtype(self) -> np.dtype:
        return self.panels.dtype

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes


def panel_width(dtype) -> int:
    """Columns per panel: one tile's, ``TILE_VECTORS`` SIMD vectors of ``dtype``."""
    return TILE_VECTORS * simd.lanes(np.dtype(dtype))


def pack(W: np.ndarray) -> PackedWeight:
    """``W`` (K, N), float32 or float64, packed into panels once (at load); read-only after."""
    K, N = W.shape
    width = panel_width(W.dtype)
    P = -(-N // width)
    padded = np.zeros((K, P * width), dtype=W.dtype)
    padded[:, :N] = W
    panels = np.ascontiguousarray(padded.reshape(K, P, width).transpose(1, 0, 2))
    panels.setflags(write=False)
    return PackedWeight(panels, (K, N))


# ----------------------------------------------------------------------------------------------
# the product
# ----------------------------------------------------------------------------------------------
@njit(inline="always", **JIT)
def _epilogue(y, y_row, yo, rows, cols, bias, b_at, residual, r_at, r_row, act, c, a, one, top):
    """``y = act(y + bias) + residual`` on one tile (``rows`` x ``cols`` at ``yo``), in the L1 cache:
    a loop a step over a row's slice, each on SIMD lanes (a branch inside a loop, or an index that
    might be negative, would keep it scalar)."""
    for r in range(rows):
        row = y[yo + r * y_row:yo + r * y_row + cols]
        if b_at >= 0:
            b = bias[b_at:b_at + cols]
            for j in range(cols):
                row[j] += b[j]
        if act == 1:                      # GELU, tanh form, as x sigmoid(2u)
            for j in range(cols):
                row[j] = gelu_tanh(row[j], c, a, one, top)
        elif act == 2:
            for j in range(cols):
                row[j] = silu(row[j], one, top)
        elif act == 3:                    # GELU, exact: erf as a rational fit (float32)
            for j in range(cols):
                row[j] = gelu_erf(row[j])
        if r_at >= 0:
            res = residual[r_at + r * r_row:r_at + r * r_row + cols]
            for j in range(cols):
                row[j] += res[j]


@njit(inline="always", **JIT)
def _tile_task(A, flat_panels, panel_at, K, width, M, N, p, rb, flat_y, y_at, y_row, flat_bias, has_bias, act,
               flat_res, has_residual, c, a, one, top):
    """One task of the product: row block ``rb`` of ``y = act(x W + bias) + residual`` by panel ``p``
    of ``W`` (K, N) (its panel at ``flat_panels[panel_at:]``; ``y``'s columns of ``W`` start at
    ``flat_y[y_at:]``, its rows ``y_row`` apart, and so do the bias's and the residual's), through the
    tile and the epilogue; a block past row M moves back to end there, a padded panel goes through scratch."""
    m = min(rb * TILE_ROWS, M - TILE_ROWS)      # the last block moves back to end at row M
    first = rb * TILE_ROWS - m                   # its rows before `first` are the block before's
    n = p * width
    cols = min(width, N - n)
    scratch = cols < width or first > 0
    if not scratch:
        out, out_row, out_at = flat_y, y_row, y_at + m * y_row + n
    else:                                        # a padded panel or a moved block: a scratch tile,
        out, out_row, out_at = np.empty(TILE_ROWS * width, dtype=flat_y.dtype), width, 0   # its new part copied
    if TILE_VECTORS == 4:
        tile4(A, flat_panels, width, panel_at, out, out, out_row, out_at, K, m, False)
    else:
        tile3(A, flat_panels, width, panel_at, out, out, out_row, out_at, K, m, False)
    # the bias is indexed by y's column: W's columns start at column y_at % y_row (y_at: a row's start plus that)
    _epilogue(out, out_row, out_at, TILE_ROWS, cols, flat_bias, y_at % y_row + n if has_bias else -1,
              flat_res, y_at + m * y_row + n if has_residual else -1, y_row, act, c, a, one, top)
    if scratch:
        for r in range(first, TILE_ROWS):
            for j in range(cols):
                flat_y[y_at + (m + r) * y_row + n + j] = out[r * width + j]


@njit(parallel=True, **JIT)
def _matmul(x, panels, N, bias, has_bias, act, residual, has_residual, y):
    """``y (M, N) = act(x (M, K) @ W + bias) + residual``, W packed (:func:`pack`); ``M >= 4``."""
    M, K = x.shape
    P, _, width = panels.shape
    A = x.T                                      # A[k, m] = x[m, k]: the tile's broadcast numbers
    flat_panels, flat_y = panels.ravel(), y.ravel()
    flat_bias, flat_res = bias.ravel(), residual.ravel()
    t = flat_y.dtype.type
    c, a, one, top = t(GELU_TANH_C), t(0.044715), t(1.0), t(EXP_MAX)
    row_blocks = (M + TILE_ROWS - 1) // TILE_ROWS
    # tasks panel by panel: a thread's run of tasks reuses one panel from its cache for every row block
    for task in prange(P * row_blocks):
        p, rb = task // row_blocks, task % row_blocks
        _tile_task(A, flat_panels, p * K * width, K, width, M, N, p, rb, flat_y, 0, N, flat_bias, has_bias, act,
                   flat_res, has_residual, c, a, one, top)


# Cache blocking, for a long K and many rows (a lesson's 2048 x 2048): a task runs K in chunks of
# BLOCK_K, each chunk over all its BLOCK_M rows before the next, so that the chunk of its panel
# (BLOCK_K x width: 128 KB with AVX-512's tile) is read from the L2 cache by every row block, where
# a whole panel (512 KB at K = 2048) shared L2 with x's rows streaming through. Measured on Zen 4:
# 2048^3 at 1.3-1.5x the product without it; at 1024^3, 512 x 768 x 3072 and a model pass's rows
# (256 at most) it was slower or level, so those keep the product above. Hence: blocked once a panel
# passes 256 KB. AVX2's panels are 3/8 as wide (192 KB at K = 2048), and on Zen 3 (AVX2) 2048^3
# blocked ran at 0.7-0.9x the product without blocking.
BLOCKED_FROM_ROWS = 512
BLOCKED_FROM_K = 256 * 1024 // (TILE_VECTORS * VECTOR_BYTES) + 1      # 1025 with AVX-512, 2731 with AVX2
BLOCK_K, BLOCK_M = 512, 128


@njit(parallel=True, **JIT)
def _matmul_blocked(x, panels, N, bias, has_bias, act, residual, has_residual, y):
    """:func:`_matmul` with cache blocking (``M >= BLOCKED_FROM_ROWS``, ``K >= BLOCKED_FROM_K``): the
    tiles of a task (a panel by ``BLOCK_M`` rows) sum into a buffer of its own, ``BLOCK_K`` numbers of
    ``k`` at a time, in the order of ``k`` (the same bits as :func:`_matmul`); then the epilogue, and
    the copy to ``y``."""
    M, K = x.shape
    P, _, width = panels.shape
    A = x.T
    flat_panels, flat_y = panels.ravel(), y.ravel()
    flat_bias, flat_res = bias.ravel(), residual.ravel()
    t = flat_y.dtype.type
    c, a, one, top = t(GELU_TANH_C), t(0.044715), t(1.0), t(EXP_MAX)
    row_blocks = (M + TILE_ROWS - 1) // TILE_ROWS
    per_task = BLOCK_M // TILE_ROWS
    tasks_a_panel = (row_blocks + per_task - 1) // per_task
    for task in prange(P * tasks_a_panel):
        p, first_rb = task // tasks_a_panel, task % tasks_a_panel * per_task
        blocks = min(per_task, row_blocks - first_rb)
        n = p * width
        cols = min(width, N - n)
        sums = np.empty(blocks * TILE_ROWS * width, dtype=flat_y.dtype)     # row block b's tile at b * 4 * width
        for k0 in range(0, K, BLOCK_K):
            kn = min(BLOCK_K, K - k0)
            for b in range(blocks):
                m = min((first_rb + b) * TILE_ROWS, M - TILE_ROWS)             # the last block moves back
                if TILE_VECTORS == 4:
                    tile4(A[k0:k0 + kn], flat_panels, width, (p * K + k0) * width, sums, sums, width,
                          b * TILE_ROWS * width, kn, m, k0 > 0)
                else:
                    tile3(A[k0:k0 + kn], flat_panels, width, (p * K + k0) * width, sums, sums, width,
                          b * TILE_ROWS * width, kn, m, k0 > 0)
        for b in range(blocks):
            m = min((first_rb + b) * TILE_ROWS, M - TILE_ROWS)
            _epilogue(sums, width, b * TILE_ROWS * width, TILE_ROWS, cols, flat_bias, n if has_bias else -1,
                      flat_res, m * N + n if has_residual else -1, N, act, c, a, one, top)
            for r in range((first_rb + b) * TILE_ROWS - m, TILE_ROWS):       # a moved block: its new rows
                for j in range(cols):
                    flat_y[(m + r) * N + n + j] = sums[(b * TILE_ROWS + r) * width + j]


@njit(parallel=True, **JIT)
def _matmul_joined(x, parts, widths, bias, has_bias, y):
    """``y (M, N_0 + N_1 + ...) = x (M, K) @ [W_0 | W_1 | ...] + bias``, each ``W_i`` packed
    (``parts[i]``, its width ``widths[i]``), its outputs beside the one before's: a layer's query, key
    and value weights in one product, ``x``'s tiles and the threads' start shared by the three.
    ``M >= 4``. Each tile is :func:`_matmul`'s, so each part's numbers are its own product's to the bit."""
    M, K = x.shape
    width = parts[0].shape[2]
    A = x.T
    flat_y, flat_bias, none = y.ravel(), bias.ravel(), np.zeros(1, dtype=y.dtype)
    t = flat_y.dtype.type
    first_panel = np.zeros(len(parts) + 1, np.int64)      # part i's panels are tasks' panels first_panel[i]...
    first_col = np.zeros(len(parts), np.int64)
    for i in range(len(parts)):
        first_panel[i + 1] = first_panel[i] + parts[i].shape[0]
        if i > 0:
            first_col[i] = first_col[i - 1] + widths[i - 1]
    row_blocks = (M + TILE_ROWS - 1) // TILE_ROWS
    for task in prange(first_panel[-1] * row_blocks):
        g, rb = task // row_blocks, task % row_blocks
        i = 0
        while g >= first_panel[i + 1]:
            i += 1
        p = g - first_panel[i]
        _tile_task(A, parts[i].ravel(), p * K * width, K, width, M, widths[i], p, rb, flat_y, first_col[i],
                   y.shape[1], flat_bias, has_bias, 0, none, False, t(0), t(0), t(1), t(0))


@njit(parallel=True, **JIT)
def _matmul_batched(x, b, y):
    """``y[n] = x[n] @ b[n]`` for every ``n``: ``x`` (B, M, K), ``b`` (B, K, N), ``M >= 4`` (attention's
    products, a head or a group of heads a batch). Each batch's ``b`` is packed here, then the tiles
    of every batch are shared among the threads."""
    B, M, K = x.shape
    N = b.shape[2]
    width = TILE_VECTORS * simd.lanes_of(y)
    P = (N + width - 1) // width
    panels = np.zeros((B, P, K, width), dtype=y.dtype)
    for bp in prange(B * P):
        n, p = bp // P, bp % P
        for k in range(K):
            for j in range(min(width, N - p * width)):
                panels[n, p, k, j] = b[n, k, p * width + j]
    flat_panels, flat_y = panels.ravel(), y.ravel()
    none = np.zeros(1, dtype=y.dtype)
    t = y.dtype.type
    row_blocks = (M + TILE_ROWS - 1) // TILE_ROWS
    for task in prange(B * P * row_blocks):
        n, rest = task // (P * row_blocks), task % (P * row_blocks)
        p, rb = rest // row_blocks, rest % row_blocks
        _tile_task(x[n].T, flat_panels, (n * P + p) * K * width, K, width, M, N, p, rb, flat_y, n * M * N, N,
                   none, False, 0, none, False, t(0), t(0), t(1), t(0))


@njit(inline="always", **JIT)
def _row_panel(x, m, panels, p, K, width, y, yo):
    """``y[yo : yo + width] = sum_k x[m, k] panels[p, k]``: one row against one panel, the running
    sums of its ``width // lanes`` vectors in registers (the tile's order of ``k``)."""
    L = simd.lanes_of(panels)
    base = p * K * width
    for v0 in range(0, width, 4 * L):            # four vectors at a time (a panel has 3 or 4)
        a0 = a1 = a2 = a3 = simd.zeros(panels)
        four = v0 + 4 * L <= width
        for k in range(K):
            w = simd.splat(x[m, k], panels)
            i = base + k * width + v0
            a0, a1, a2 = simd.fma(w, simd.load(panels, i), a0), simd.fma(w, simd.load(panels, i + L), a1), \
                simd.fma(w, simd.load(panels, i + 2 * L), a2)
            if four:
                a3 = simd.fma(w, simd.load(panels, i + 3 * L), a3)
        simd.store(y, yo + v0, a0), simd.store(y, yo + v0 + L, a1), simd.store(y, yo + v0 + 2 * L, a2)
        if four:
            simd.store(y, yo + v0 + 3 * L, a3)


@njit(parallel=True, **JIT)
def _matmul_few(x, panels, N, bias, has_bias, act, residual, has_residual, y):
    """:func:`_matmul` for fewer than four rows (a token generated at a time): each row against each
    panel (:func:`_row_panel`), the panels shared out among the threads. Bound by reading ``W``."""
    M, K = x.shape
    P, _, width = panels.shape
    flat_panels, flat_y = panels.ravel(), y.ravel()
    flat_bias, flat_res = bias.ravel(), residual.ravel()
    t = flat_y.dtype.type
    c, a, one, top = t(GELU_TANH_C), t(0.044715), t(1.0), t(EXP_MAX)
    for p in prange(P):
        n = p * width
        cols = min(width, N - n)
        out = np.empty(M * width, dtype=flat_y.dtype)
        for m in range(M):
            _row_panel(x, m, flat_panels, p, K, width, out, m * width)
        _epilogue(out, width, 0, M, cols, flat_bias, n if has_bias else -1,
                  flat_res, n if has_residual else -1, N, act, c, a, one, top)
        for m in range(M):
            for j in range(cols):
                flat_y[m * N + n + j] = out[m * width + j]


def _call(x, W, bias, activation, residual):
    """The compiled kernel for these operands and its arguments (the output last, fresh)."""
    M, K = x.shape
    if K != W.shape[0]:
        raise ValueError(f"x has {K} columns, the weight {W.shape[0]} rows")
    N = W.shape[1]
    dtype = W.dtype
    if activation == "gelu_erf" and dtype != np.float32:
        raise ValueError("The fused exact GELU is float32's (erf as a rational fit); float64 takes math.erf apart.")
    none = np.zeros(1, dtype=dtype)
    blocked = M >= BLOCKED_FROM_ROWS and K >= BLOCKED_FROM_K
    kernel = _matmul_few if M < TILE_ROWS else _matmul_blocked if blocked else _matmul
    return kernel, (np.ascontiguousarray(x, dtype=dtype), W.panels, N,
                    none if bias is None else np.ascontiguousarray(bias, dtype=dtype), bias is not None,
                    ACTIVATIONS[activation], none if residual is None else np.ascontiguousarray(residual, dtype=dtype),
                    residual is not None, np.empty((M, N), dtype=dtype))


def matmul(x: np.ndarray, W: PackedWeight, bias: np.ndarray | None = None, activation: str = "none",
           residual: np.ndarray | None = None) -> np.ndarray:
    """``act(x @ W + bias) + residual`` for ``x`` (M, K) and a packed ``W`` (K, N), in a new array.

    ``activation``: ``"none"``, ``"gelu_tanh"``, ``"silu"`` or, float32 only, ``"gelu_erf"``;
    ``bias`` (N,) and ``residual`` (M, N) may be None."""
    kernel, args = _call(x, W, bias, activation, residual)
    kernel(*args)
    return args[-1]


def _joined_call(x: np.ndarray, Ws, bias):
    """:func:`_matmul_joined`'s arguments for these operands (the output last, fresh), or None for fewer
    rows than a tile or weights of another dtype or height than the first's."""
    M, K = x.shape
    dtype = Ws[0].dtype
    if M < TILE_ROWS or any(W.shape[0] != K or W.dtype != dtype for W in Ws):
        return None
    widths = np.array([W.shape[1] for W in Ws], np.int64)
    none = np.zeros(1, dtype=dtype)
    return (np.ascontiguousarray(x, dtype=dtype), tuple(W.panels for W in Ws), widths,
            none if bias is None else np.ascontiguousarray(bias, dtype=dtype), bias is not None,
            np.empty((M, int(widths.sum())), dtype=dtype))


def joined_matmul(x: np.ndarray, Ws, bias: np.ndarray | None = None) -> np.ndarray | None:
    """``x @ [W_0 | W_1 | ...] + bias`` for ``x`` (M, K), ``M >= TILE_ROWS``, and packed weights ``Ws``
    of one dtype and height, their outputs side by side, in one product (:func:`_matmul_joined`);
    ``bias`` covers them all, or is None. None for fewer rows or mismatched weights: the caller
    multiplies them one by one."""
    args = _joined_call(x, Ws, bias)
    if args is None:
        return None
    _matmul_joined(*args)
    return args[-1]


def joined_matmul_if_loaded(x: np.ndarray, Ws, bias: np.ndarray | None = None) -> np.ndarray | None:
    """:func:`joined_matmul`, or None also while its kernel is not loaded (:func:`core.readiness.can_run`)."""
    args = _joined_call(x, Ws, bias)
    if args is None or not can_run(_matmul_joined, *args):
        return None
    _matmul_joined(*args)
    return args[-1]


def matmul_batched_if_loaded(x: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``x @ b`` for ``x`` (B, M, K) and ``b`` (B, K, N) of one float dtype, ``M >= 4``, through the
    register tile, in a new array; None while its kernel is not loaded (:func:`core.readiness.can_run`)."""
    args = (np.ascontiguousarray(x), np.ascontiguousarray(b), np.empty((x.shape[0], x.shape[1], b.shape[2]), x.dtype))
    if not can_run(_matmul_batched, *args):
        return None
    _matmul_batched(*args)
    return args[-1]


def matmul_if_loaded(x: np.ndarray, W: PackedWeight, bias: np.ndarray | None = None, activation: str = "none",
                     residual: np.ndarray | None = None) -> np.ndarray | None:
    """:func:`matmul`, or None while its kernel for these operands is not loaded (it would compile
    on this thread: :func:`core.readiness.can_run`); the caller then takes another product."""
    kernel, args = _call(x, W, bias, activation, residual)
    if not can_run(kernel, *args):
        return None
    kernel(*args)
    return args[-1]
