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
  ``TILE_VECTORS`` vectors of ``x``'s rows: each weight is unpacked once per pass.

The readable twin is the product of the widened matrix (:meth:`PackedMatrix.widen`), which the
tests hold this to. Each output's sum runs in one order whatever the thread count.
"""
from __future__ import annotations

import numpy as np
import numba
from numba import njit, prange

from core.kernels.tuned import simd
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


@njit(parallel=True, **JIT)
def _product_many(x, raw, order, fmt, bias, has_bias, shares, y):
    """``y (M, N) = x (M, K) @ R^T + bias``: ``x`` laid out once as panels of ``TILE_VECTORS`` vectors of
    rows (``xP[c, k, j] = x[c width + j, k]``, zero-padded), read by the tile in order; then for each
    ``OUTPUTS_PER_TASK`` outputs their packed rows unpacked side by side (``A[k, r]``) and the register
    tile run over every panel of ``x``, four outputs by ``TILE_VECTORS`` vectors of rows, into a buffer
    ``out[r, m]`` (output ``n0 + r``, row ``m``) from which the task's outputs go to ``y`` a row at a
    time: written to ``y`` straight from the tile, a vocabulary's 49,152 outputs put each number of a
    task on another page."""
    M, K = x.shape
    N = order.shape[0]
    flat_raw = raw.reshape(-1)
    L = simd.lanes_of(y)
    width = TILE_VECTORS * L
    C = (M + width - 1) // width
    Mp = C * width
    xP = np.zeros(C * K * width, dtype=np.float32)
    for c in prange(C):
        for j in range(min(width, M - c * width)):
            for k in range(K):
                xP[(c * K + k) * width + j] = x[c * width + j, k]
    row_bytes, block_bytes = raw.shape[1], BLOCK_BYTES[fmt]
    tasks = (N + OUTPUTS_PER_TASK - 1) // OUTPUTS_PER_TASK
    shares = min(tasks, shares)
    for share in prange(shares):
        w = np.empty(OUTPUTS_PER_TASK * K, dtype=np.float32)   # the outputs' rows, one after the other
        out = np.empty(OUTPUTS_PER_TASK * Mp, dtype=np.float32)
        for task in range(share * tasks // shares, (share + 1) * tasks // shares):
            n0 = task * OUTPUTS_PER_TASK
            outs = min(OUTPUTS_PER_TASK, N - n0)
            for r in range(outs):
                start = order[n0 + r] * row_bytes
                for b in range(K // BLOCK):
                    for j in range(0, BLOCK, L):
                        simd.store(w, r * K + b * BLOCK + j, _weights(flat_raw, start + b * block_bytes, fmt, j, w))
            for c in range(C):
                for q in range(0, outs, TILE_ROWS):
                    A = w[q * K:(q + TILE_ROWS) * K].reshape(TILE_ROWS, K).T     # A[k, r]: weight k of output n0 + q + r
                    if TILE_VECTORS == 4:
                        tile4(A, xP, width, c * K * width, out, out, Mp, q * Mp + c * width, K, 0, False)
                    else:
                        tile3(A, xP, width, c * K * width, out, out, Mp, q * Mp + c * width, K, 0, False)
            if outs == OUTPUTS_PER_TASK:         # a count known when compiling: the copy runs 4x faster
                _rows_out(out, Mp, M, OUTPUTS_PER_TASK, bias, has_bias, n0, y)
            else:
                _rows_out(out, Mp, M, outs, bias, has_bias, n0, y)


@njit(inline="always", **JIT)
def _rows_out(out, Mp, M, outs, bias, has_bias, n0, y):
    """``y[m, n0 + r] = out[r Mp + m] + bias[n0 + r]`` for rows ``m < M`` and outputs ``r < outs``."""
    for m in range(M):
        for r in range(outs):
            y[m, n0 + r] = out[r * Mp + m] + (bias[n0 + r] if has_bias else np.float32(0.0))


def _call(x: np.ndarray, raw: np.ndarray, order: np.ndarray, fmt: str, bias):
    """The kernel for these operands and its arguments (the output last, fresh)."""
    M, K = x.shape
    if fmt not in FORMATS:
        raise ValueError(f"No packed product for {fmt}; it multiplies {', '.join(FORMATS)}.")
    if K % BLOCK or raw.shape[1] != _LAYOUT[fmt].row_bytes(K):
        raise ValueError(f"x has {K} columns, which the packed rows ({raw.shape[1]} bytes of {fmt}) do not hold.")
    N = order.shape[0]
    none = np.zeros(1, dtype=np.float32)
    b = none if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    x, y = np.ascontiguousarray(x, dtype=np.float32), np.empty((M, N), dtype=np.float32)
    if M < FEW_ROWS:
        return _product_few, (x, raw, order, FORMATS[fmt], b, bias is not None, y)
    # the many rows' tasks in a few runs a thread, each run with buffers of its own
    return _product_many, (x, raw, order, FORMATS[fmt], b, bias is not None, 4 * numba.get_num_threads(), y)


def rows_product(x: np.ndarray, raw: np.ndarray, order: np.ndarray, fmt: str, bias=None) -> np.ndarray:
    """``x @ R^T + bias``, float32 ``(M, N)``: ``x`` (M, K); ``R``'s row ``n`` is packed row ``order[n]``
    of ``raw`` (n_rows, row_bytes), in ``fmt`` (one of :data:`FORMATS`); ``bias`` (N,) or None."""
    kernel, args = _call(x, raw, order, fmt, bias)
    note(kernel)
    kernel(*args)
    return args[-1]


def rows_product_if_loaded(x, raw, order, fmt, bias=None) -> np.ndarray | None:
    """:func:`rows_product`, or None while its kernel for these operands would compile on this thread
    (:func:`core.readiness.can_run`): the caller widens the matrix instead."""
    kernel, args = _call(x, raw, order, fmt, bias)
    if not can_run(kernel, *args):
        return None
    note(kernel)
    kernel(*args)
    return args[-1]
