"""A product with a quantised GGUF matrix read in its packed form: ``x @ R^T``, ``R`` the matrix's
packed rows (a linear layer's ``(out, in)`` rows, or a token table's rows for a tied unembedding).

Widening a layer to float32 before its product writes 4 bytes a weight to memory and reads them
back: a SmolLM2 block's 3.5 million weights take 14 MB as float32, where the file holds them in
2.2 MB. Here the codes are unpacked a SIMD vector at a time (:func:`_weights`, the widening loops of
:mod:`core.model.gguf.quants` vectorised: the same float32 weights, to the bit) and used at once:

- **few rows** (a token generated at a time): each packed row is unpacked once and its dot
  product with every row of ``x`` summed in SIMD vectors; the rows are shared out among the threads;
- **more rows** (a forward pass over a text): ``x^T`` is laid out once in panels the tile reads in
  order, sixteen packed rows are unpacked side by side, and the register tile of
  :mod:`core.kernels.tuned.gemm` multiplies them four at a time by each panel, four outputs by
  ``TILE_VECTORS`` vectors of ``x``'s rows: each weight is unpacked once per pass. Several matrices
  that read the same ``x`` go through one such product (:func:`joined_product_if_loaded`): a layer's
  query, key and value weights, their outputs side by side; SwiGLU's gate and up weights, each task
  finishing its outputs as ``silu(gate) * up`` while they are in the cache.

The readable twin is the product of the widened matrix (:meth:`PackedMatrix.widen`), which the
tests hold this to. Each output's sum runs in one order whatever the thread count.
"""
from __future__ import annotations

import numpy as np
import numba
from numba import njit, prange

from core.kernels.tuned import simd
from core.kernels.tuned.fastexp import EXP_MAX, silu
from core.kernels.tuned.gemm import TILE_ROWS, TILE_VECTORS, tile3, tile4
from core.model.gguf.quants import FORMATS as BLOCK_FORMATS, half
from core.readiness import can_run
from core.recording import note

JIT = dict(cache=True, nogil=True, error_model="numpy")
FORMATS = {"Q4_1": 0, "Q8_0": 1, "Q4_0": 2}      # the block formats multiplied in their packed form
_LAYOUT = {f.name: f for f in BLOCK_FORMATS.values() if f.name in FORMATS}     # their blocks, as quants packs them
BLOCK = 32                                       # weights per block in each of FORMATS
BLOCK_BYTES = np.array([_LAYOUT[name].nbytes for name in FORMATS])          # by the numbers of FORMATS
FEW_ROWS = TILE_ROWS                             # fewer rows of x than this take the dot-product path


@njit(inline="always", **JIT)
def _weights(raw, o, fmt, j, like):
    """Weights ``j .. j + lanes - 1`` (``j`` a multiple of the lanes, below 32) of the block at byte
    ``o`` of ``raw`` (flat), float32 exactly as the widening loops of :mod:`~core.model.gguf.quants`
    give them: Q4_1 ``d q + m``, Q8_0 ``q d``, Q4_0 ``(q - 8) d``; a 4-bit block keeps weight ``j``
    in the low nibble of its byte ``j`` and weight ``j + 16`` in the high one."""
    if fmt == 1:
        return simd.splat(half(raw[o], raw[o + 1]), like) * simd.signed_bytes(raw, o + 2 + j, like)
    at = (o + 4 if fmt == 0 else o + 2) + j % 16
    q = simd.low_nibbles(raw, at, like) if j < 16 else simd.high_nibbles(raw, at, like)
    d = simd.splat(half(raw[o], raw[o + 1]), like)
    if fmt == 0:
        return d * q + simd.splat(half(raw[o + 2], raw[o + 3]), like)
    return (q - simd.splat(8.0, like)) * d


@njit(parallel=True, **JIT)
def _product_few(x, raw, order, fmt, bias, has_bias, y):
    """``y (M, N) = x (M, K) @ R^T + bias`` for a few rows: output ``n`` reads packed row ``order[n]``,
    unpacked a vector at a time into the running sums of its dot product with each row of ``x``."""
    M, K = x.shape
    N = order.shape[0]
    flat_x, flat_raw = x.ravel(), raw.reshape(-1)
    L = simd.lanes_of(flat_x)
    row_bytes, block_bytes = raw.shape[1], BLOCK_BYTES[fmt]
    chunk = 16                                   # outputs per task
    for task in prange((N + chunk - 1) // chunk):
        for n in range(task * chunk, min(N, (task + 1) * chunk)):
            start = order[n] * row_bytes
            for m in range(M):
                a0 = a1 = simd.zeros(flat_x)
                for b in range(K // BLOCK):
                    o, xo = start + b * block_bytes, m * K + b * BLOCK
                    for j in range(0, BLOCK, 2 * L):
                        a0 = simd.fma(_weights(flat_raw, o, fmt, j, flat_x), simd.load(flat_x, xo + j), a0)
                        a1 = simd.fma(_weights(flat_raw, o, fmt, j + L, flat_x), simd.load(flat_x, xo + j + L), a1)
                y[m, n] = simd.total(a0 + a1) + (bias[n] if has_bias else np.float32(0.0))


# A task of the product over many rows unpacks this many outputs' packed rows, and runs the tile for
# each four of them over every panel of x's rows: four tiles read a panel while it is in the cache.
OUTPUTS_PER_TASK = 4 * TILE_ROWS


@njit(inline="always", **JIT)
def _unpack_rows(raws, orders, parts_end, skip, n0, outs, fmt, K, w, L):
    """The packed rows of outputs ``skip + n0 ... skip + n0 + outs - 1`` of the parts side by side
    (part ``p``'s outputs end at ``parts_end[p]``), unpacked one after the other into ``w``."""
    for r in range(outs):
        n = skip + n0 + r
        p = 0
        while n >= parts_end[p]:
            p += 1
        raw = raws[p]
        flat_raw = raw.reshape(-1)
        start = orders[p][n - (parts_end[p - 1] if p > 0 else 0)] * raw.shape[1]
        block_bytes = BLOCK_BYTES[fmt]
        for b in range(K // BLOCK):
            for j in range(0, BLOCK, L):
                simd.store(w, r * K + b * BLOCK + j, _weights(flat_raw, start + b * block_bytes, fmt, j, w))


@njit(parallel=True, **JIT)
def _product_many(x, raws, orders, fmt, bias, has_bias, gated, shares, y):
    """``y (M, N) = x (M, K) @ R^T + bias``, ``R`` the packed rows of the parts ``raws[p]`` in the orders
    ``orders[p]``, one after the other (a layer's query, key and value weights: one product); or
    ``gated``, two parts: ``y = silu(x R_0^T) * (x R_1^T)`` (SwiGLU's gate and up projections).
    The tasks go in ``shares`` runs, each with buffers of its own.

    ``x`` is laid out once as panels of ``TILE_VECTORS`` vectors of rows (``xP[c, k, j] = x[c width + j,
    k]``, zero-padded), read by the tile in order. Then for each ``OUTPUTS_PER_TASK`` outputs their
    packed rows are unpacked side by side (``A[k, r]``; gated, the gate's and then the up's) and the
    register tile runs over every panel of ``x``, four outputs by ``TILE_VECTORS`` vectors of rows, into
    a buffer ``out[r, m]`` (output ``n0 + r``, row ``m``) from which the task's outputs go to ``y`` a row
    at a time: written to ``y`` straight from the tile, a vocabulary's 49,152 outputs put each number
    of a task on another page. The gate's SiLU is the tuned pass's (:func:`core.model.tuned.forward.silu`)."""
    M, K = x.shape
    n_parts = len(orders)
    parts_end = np.empty(n_parts, np.int64)
    total = 0
    for p in range(n_parts):
        total += orders[p].shape[0]
        parts_end[p] = total
    N = orders[0].shape[0] if gated else total
    L = simd.lanes_of(y)
    width = TILE_VECTORS * L
    C = (M + width - 1) // width
    Mp = C * width
    xP = np.zeros(C * K * width, dtype=np.float32)
    for c in prange(C):
        for j in range(min(width, M - c * width)):
            for k in range(K):
                xP[(c * K + k) * width + j] = x[c * width + j, k]
    tasks = (N + OUTPUTS_PER_TASK - 1) // OUTPUTS_PER_TASK
    shares = min(tasks, shares)
    one, top = np.float32(1.0), np.float32(EXP_MAX)
    for share in prange(shares):
        w = np.empty(OUTPUTS_PER_TASK * K, dtype=np.float32)
        out = np.empty(OUTPUTS_PER_TASK * Mp, dtype=np.float32)
        w_up = np.empty(OUTPUTS_PER_TASK * K if gated else 0, dtype=np.float32)      # gated: the up rows
        up = np.empty(OUTPUTS_PER_TASK * Mp if gated else 0, dtype=np.float32)
        for task in range(share * tasks // shares, (share + 1) * tasks // shares):
            n0 = task * OUTPUTS_PER_TASK
            outs = min(OUTPUTS_PER_TASK, N - n0)
            _unpack_rows(raws, orders, parts_end, 0, n0, outs, fmt, K, w, L)
            if gated:
                _unpack_rows(raws, orders, parts_end, N, n0, outs, fmt, K, w_up, L)
            for c in range(C):
                for q in range(0, outs, TILE_ROWS):
                    _tile(w, xP, K, width, Mp, c, q, out)
                    if gated:
                        _tile(w_up, xP, K, width, Mp, c, q, up)
            if gated:                            # two arrays, one flat loop: its exp runs in SIMD lanes
                for i in range(outs * Mp):
                    out[i] = silu(out[i], one, top) * up[i]
            if outs == OUTPUTS_PER_TASK:         # a count known when compiling: the copy runs 4x faster
                _rows_out(out, Mp, M, OUTPUTS_PER_TASK, bias, has_bias, n0, y)
            else:
                _rows_out(out, Mp, M, outs, bias, has_bias, n0, y)


@njit(inline="always", **JIT)
def _tile(w, xP, K, width, Mp, c, q, out):
    """Outputs ``q ... q + 3`` of a task (their unpacked rows in ``w``) by panel ``c`` of ``x``'s rows,
    into ``out[r Mp + m]``."""
    A = w[q * K:(q + TILE_ROWS) * K].reshape(TILE_ROWS, K).T     # A[k, r]: weight k of output q + r
    if TILE_VECTORS == 4:
        tile4(A, xP, width, c * K * width, out, out, Mp, q * Mp + c * width, K, 0, False)
    else:
        tile3(A, xP, width, c * K * width, out, out, Mp, q * Mp + c * width, K, 0, False)


@njit(inline="always", **JIT)
def _rows_out(out, Mp, M, outs, bias, has_bias, n0, y):
    """``y[m, n0 + r] = out[r Mp + m] + bias[n0 + r]`` for rows ``m < M`` and outputs ``r < outs``."""
    for m in range(M):
        for r in range(outs):
            y[m, n0 + r] = out[r * Mp + m] + (bias[n0 + r] if has_bias else np.float32(0.0))


def _call(x: np.ndarray, parts, fmt: str, bias, gated: bool = False):
    """The kernel for these operands and its arguments (the output last, fresh); ``parts``: one or more
    ``(raw, order)``, their outputs side by side (``gated``: two, the gate's and the up's)."""
    M, K = x.shape
    if fmt not in FORMATS:
        raise ValueError(f"No packed product for {fmt}; it multiplies {', '.join(FORMATS)}.")
    for raw, _ in parts:
        if K % BLOCK or raw.shape[1] != _LAYOUT[fmt].row_bytes(K):
            raise ValueError(f"x has {K} columns, which the packed rows ({raw.shape[1]} bytes of {fmt}) do not hold.")
    N = parts[0][1].shape[0] if gated else sum(order.shape[0] for _, order in parts)
    none = np.zeros(1, dtype=np.float32)
    b = none if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    x, y = np.ascontiguousarray(x, dtype=np.float32), np.empty((M, N), dtype=np.float32)
    if M < FEW_ROWS:
        (raw, order), = parts
        return _product_few, (x, raw, order, FORMATS[fmt], b, bias is not None, y)
    # the many rows' tasks in a few runs a thread, each run with buffers of its own
    return _product_many, (x, tuple(raw for raw, _ in parts), tuple(order for _, order in parts), FORMATS[fmt], b,
                           bias is not None, gated, 4 * numba.get_num_threads(), y)


def rows_product(x: np.ndarray, raw: np.ndarray, order: np.ndarray, fmt: str, bias=None) -> np.ndarray:
    """``x @ R^T + bias``, float32 ``(M, N)``: ``x`` (M, K); ``R``'s row ``n`` is packed row ``order[n]``
    of ``raw`` (n_rows, row_bytes), in ``fmt`` (one of :data:`FORMATS`); ``bias`` (N,) or None."""
    return _run(*_call(x, ((raw, order),), fmt, bias))


def rows_product_if_loaded(x, raw, order, fmt, bias=None) -> np.ndarray | None:
    """:func:`rows_product`, or None while its kernel for these operands would compile on this thread
    (:func:`core.readiness.can_run`): the caller widens the matrix instead."""
    return _run_if_loaded(*_call(x, ((raw, order),), fmt, bias))


def joined_product(x, parts, fmt, gated: bool = False) -> np.ndarray:
    """``x @ [R_0^T | R_1^T | ...]`` for ``x`` of ``FEW_ROWS`` rows or more (``parts``: ``(raw, order)``
    each, in ``fmt``), the parts' outputs side by side in one product; or ``gated`` (two parts):
    ``silu(x R_0^T) * (x R_1^T)``."""
    return _run(*_call(x, tuple(parts), fmt, None, gated))


def joined_product_if_loaded(x, parts, fmt, gated: bool = False) -> np.ndarray | None:
    """:func:`joined_product`, or None for fewer than ``FEW_ROWS`` rows of ``x`` or while the kernel
    would compile here: the caller multiplies part by part."""
    if x.shape[0] < FEW_ROWS:
        return None
    return _run_if_loaded(*_call(x, tuple(parts), fmt, None, gated))


def _run(kernel, args) -> np.ndarray:
    note(kernel)
    kernel(*args)
    return args[-1]


def _run_if_loaded(kernel, args) -> np.ndarray | None:
    return _run(kernel, args) if can_run(kernel, *args) else None
