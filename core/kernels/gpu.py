"""Lesson kernels for CUDA: the kernels of ``core/kernels/cpu.py``, under the same names, on a GPU.

Each kernel is a formula of ``core/kernels/reference.py`` (the plain NumPy oracle the tests compare
against). Where the CPU kernel loops over ``(b, h, i, j)``, here each GPU thread takes one of those
positions: its number in the grid, ``cuda.grid(1)``, says which.

    S = Q K^T * scale          scores_kernel           one thread per score
    S = S + M                  add_mask_kernel         one thread per score
    A = softmax(S) by rows     softmax_kernel          one thread per row
    out = A V                  weighted_sum_kernel     one thread per output entry
    out without building A     fused_attention_kernel  one thread per query; a block shares key tiles
    X W + b, split into heads  project_heads_kernel    one thread per output entry
    Concat(heads) W_O + b_O    merge_heads_project_kernel
    PE[p, 2i], PE[p, 2i+1]     sinusoidal_kernel

The host drivers below the kernels have the names and arguments of ``core/kernels/cpu.py``'s: they
take validated, C-contiguous NumPy arrays of one float dtype (float32 or float64), copy them to the
device, launch, and return NumPy arrays of that dtype. Masks are additive and 4-D, each axis 1
(broadcast) or full size. No ``fastmath``: the masks rely on ``-inf`` arithmetic.

Arithmetic stays in the data's precision: a bare ``0.0`` is a float64 in Numba, so sums start
from a first term (or a bias), and the fused kernel, whose shared and local arrays need a dtype
and a size when it compiles, is built per ``(dtype, tile, d_k, d_v)`` by a small factory.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import cuda


# Tunables, in one place and read at launch time, so tests can patch them small.
THREADS = 128              # threads per block
TILE = 16                  # keys per shared-memory tile in the fused kernel
SHARED_BYTES = 48 * 1024   # shared memory a block may use; wide heads get shorter key tiles

# --- device helpers ------------------------------------------------------------------------


@cuda.jit(device=True)
def position(n, shape):
    """The index ``(b, h, i, j)`` of entry number ``n`` of a C-ordered 4-D array of this shape."""
    j = n % shape[3]
    i = n // shape[3] % shape[2]
    h = n // (shape[3] * shape[2]) % shape[1]
    b = n // (shape[3] * shape[2] * shape[1])
    return b, h, i, j


@cuda.jit(device=True)
def mask_entry(mask, b, h, i, j):
    """``M[b, h, i, j]`` with NumPy broadcasting: an axis of size 1 holds one entry for every index,
    which ``min(b, Bm - 1) = 0`` picks."""
    Bm, Hm, Tqm, Tkm = mask.shape
    return mask[min(b, Bm - 1), min(h, Hm - 1), min(i, Tqm - 1), min(j, Tkm - 1)]


@cuda.jit(device=True)
def dot(x, y):
    """``x . y`` for two vectors of one length (starting from the first term keeps their dtype)."""
    total = x[0] * y[0]
    for c in range(1, x.shape[0]):
        total += x[c] * y[c]
    return total


@cuda.jit(device=True)
def softmax_row(s, a):
    """``a = softmax(s)`` for one row of scores; a row with nothing allowed (all -inf) gives zeros."""
    # 1. the row's maximum, subtracted before exp so that no exp overflows
    m = s[0]
    for j in range(1, s.shape[0]):
        m = max(m, s[j])
    if m == -math.inf:                    # nothing allowed: zero weights, not 0 / 0 = NaN
        for j in range(a.shape[0]):
            a[j] = 0
        return
    # 2. exponentiate (a masked score, -inf, becomes exactly 0) and sum
    for j in range(s.shape[0]):
        a[j] = math.exp(s[j] - m)
    total = a[0]
    for j in range(1, a.shape[0]):
        total += a[j]
    # 3. normalise, so the row sums to 1
    for j in range(a.shape[0]):
        a[j] /= total


@cuda.jit(device=True)
def online_step(s, v, m, l, acc):
    """Fold one key (score ``s``, value row ``v``) into a row's running max ``m``, sum ``l`` and
    output ``acc = sum_j exp(s_j - m) v_j``; returns the new ``(m, l)``."""
    if s == -math.inf:                    # a masked key adds nothing
        return m, l
    if s > m:                             # a new maximum: rescale what was summed so far
        alpha = math.exp(m - s)           # exp(-inf) = 0 on the row's first allowed key
        l = l * alpha
        for c in range(acc.shape[0]):
            acc[c] *= alpha
        m = s
    p = math.exp(s - m)
    for c in range(acc.shape[0]):
        acc[c] += p * v[c]
    return m, l + p


@cuda.jit(device=True)
def load_rows(src, b, h, k0, n_rows, tile):
    """The block copies rows ``k0 .. k0 + n_rows - 1`` of ``src[b, h]`` into a shared ``tile``;
    thread t copies entries t, t + (threads per block), ... so neighbours read neighbours."""
    width = tile.shape[1]
    for e in range(cuda.threadIdx.x, n_rows * width, cuda.blockDim.x):
        tile[e // width, e % width] = src[b, h, k0 + e // width, e % width]


# --- kernels -------------------------------------------------------------------------------


@cuda.jit
def scores_kernel(Q, K, scale, S):
    """``S = Q K^T * scale``: thread n computes ``S[b, h, i, j] = (q_i . k_j) * scale``.

    Q (B, H, Tq, d_k), K (B, H, Tk, d_k) -> S (B, H, Tq, Tk).
    """
    n = cuda.grid(1)
    if n < S.size:
        b, h, i, j = position(n, S.shape)
        S[b, h, i, j] = dot(Q[b, h, i], K[b, h, j]) * scale


@cuda.jit
def add_mask_kernel(S, mask):
    """``S = S + M`` in place: 0 leaves a score as it is, -inf forbids query i to look at key j.

    S (B, H, Tq, Tk); mask (Bm, Hm, Tqm, Tkm), each axis 1 (broadcast) or full size.
    """
    n = cuda.grid(1)
    if n < S.size:
        b, h, i, j = position(n, S.shape)
        S[b, h, i, j] += mask_entry(mask, b, h, i, j)


@cuda.jit
def softmax_kernel(S, A):
    """``A = softmax(S)`` over each row's keys, one thread per row ``(b, h, i)``.

    S (B, H, Tq, Tk) -> A (B, H, Tq, Tk); every row of A sums to 1 (or is all 0 when masked).
    """
    B, H, Tq, _ = S.shape
    row = cuda.grid(1)
    if row < B * H * Tq:
        b, h, i = row // (H * Tq), row // Tq % H, row % Tq
        softmax_row(S[b, h, i], A[b, h, i])


@cuda.jit
def weighted_sum_kernel(A, V, out):
    """``out = A V``: thread n computes ``out[b, h, i, c]``, row i of A . column c of V.

    A (B, H, Tq, Tk), V (B, H, Tk, d_v) -> out (B, H, Tq, d_v).
    """
    n = cuda.grid(1)
    if n < out.size:
        b, h, i, c = position(n, out.shape)
        out[b, h, i, c] = dot(A[b, h, i], V[b, h, :, c])


@functools.lru_cache(maxsize=None)
def fused_attention_kernel(dtype, tile, d_k, d_v):
    """``out = softmax(Q K^T * scale + M) V`` without building the (Tq, Tk) matrix, built for one
    precision, key tile and head width. Each thread keeps one query row's running max ``m``, sum
    ``l`` and unnormalised output ``acc`` (as ``online_step`` updates them); ``out = acc / l``."""
    real = numba.from_dtype(dtype)

    @cuda.jit
    def fused_attention_kernel(Q, K, V, mask, scale, out):
        # grid (query blocks, B*H): thread i of the grid's row owns query i of head (b, h)
        H, Tq, Tk = Q.shape[1], Q.shape[2], K.shape[2]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        i = cuda.grid(1)
        active = i < Tq                                  # idle threads still load tiles and wait
        K_tile = cuda.shared.array((tile, d_k), real)    # (tile, d_k), shared by the block
        V_tile = cuda.shared.array((tile, d_v), real)    # (tile, d_v)
        acc = cuda.local.array(d_v, real)                # (d_v,), this thread's own
        for c in range(d_v):
            acc[c] = 0
        m, l = real(-math.inf), real(0)                  # nothing seen yet
        for k0 in range(0, Tk, tile):
            n_keys = min(tile, Tk - k0)
            # 1. the block copies keys and values k0 .. k0 + n_keys - 1 to shared memory
            load_rows(K, b, h, k0, n_keys, K_tile)
            load_rows(V, b, h, k0, n_keys, V_tile)
            cuda.syncthreads()
            # 2. each thread folds the tile's keys into its row, one key at a time
            for jj in range(n_keys):
                if active:
                    s = dot(Q[b, h, i], K_tile[jj]) * scale + mask_entry(mask, b, h, i, k0 + jj)
                    m, l = online_step(s, V_tile[jj], m, l, acc)
            cuda.syncthreads()                           # no one overwrites a tile still read
        # 3. normalise once; a row with nothing allowed has l = 0 and outputs zeros
        if active:
            for c in range(d_v):
                out[b, h, i, c] = acc[c] / l if l > 0 else real(0)
    return fused_attention_kernel


@cuda.jit
def project_heads_kernel(X, W, bias, out):
    """``X W + b`` split into heads: thread n computes ``out[b, h, t, c]``, column h*d + c.

    X (B, T, d_in), W (d_in, H*d), bias (H*d,) -> out (B, H, T, d).
    """
    n = cuda.grid(1)
    if n < out.size:
        b, h, t, c = position(n, out.shape)
        col = h * out.shape[3] + c                       # head h owns columns h*d .. h*d + d - 1
        total = bias[col]
        for k in range(X.shape[2]):
            total += X[b, t, k] * W[k, col]
        out[b, h, t, c] = total


@cuda.jit
def merge_heads_project_kernel(O, W_O, bias, out):
    """``Concat(O_1, ..., O_H) W_O + b_O``, read straight from the heads (no concat is built).

    Thread n computes ``out[b, t, c]``; head h's output meets its own row block of W_O.
    O (B, H, T, d_v), W_O (H*d_v, d_out), bias (d_out,) -> out (B, T, d_out).
    """
    B, T, d_out = out.shape
    H, d_v = O.shape[1], O.shape[3]
    n = cuda.grid(1)
    if n < out.size:
        b, t, c = n // (T * d_out), n // d_out % T, n % d_out
        total = bias[c]
        for h in range(H):
            for k in range(d_v):                         # row block h of W_O: rows h*d_v + k
                total += O[b, h, t, k] * W_O[h * d_v + k, c]
        out[b, t, c] = total


@cuda.jit
def sinusoidal_kernel(base, PE):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))``.

    Thread n computes ``PE[p, c]``; the angle is taken in float64 whatever PE's dtype (it loses
    digits fastest at large p), and rounded once, at the store.
    """
    T, d_model = PE.shape
    n = cuda.grid(1)
    if n < T * d_model:
        p, c = n // d_model, n % d_model
        two_i = c - c % 2                                # both columns of a pair share one angle
        angle = p / math.pow(base, two_i / d_model)
        PE[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)


# --- host drivers ------------------------------------------------------------------------------


def _grid(n: int):
    """Launch configuration ``(blocks, THREADS)``: enough blocks for ``n`` threads (at least one)."""
    return max(1, -(-n // THREADS)), THREADS


def _to_device(arr, dtype):
    """Copy to the device, C-contiguous and in the computation's dtype (a float64 mask with float32
    data would otherwise turn the arithmetic to float64)."""
    return cuda.to_device(np.ascontiguousarray(arr, dtype=dtype))


def _scores_on_device(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` as a device array (B, H, Tq, Tk), left there for the next kernel."""
    B, H, Tq, _ = Q.shape
    dt = Q.dtype
    S = cuda.device_array((B, H, Tq, K.shape[2]), dtype=dt)
    scores_kernel[_grid(S.size)](_to_device(Q, dt), _to_device(K, dt), dt.type(scale), S)
    add_mask_kernel[_grid(S.size)](S, _to_device(mask, dt))
    return S


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + M`` -> (B, H, Tq, Tk)."""
    return _scores_on_device(Q, K, mask, scale).copy_to_host()


def _attention_on_device(Q, K, V, mask, scale):
    """``out = A V``, ``A = softmax(S)`` and ``S = Q K^T * scale + M`` as device arrays."""
    B, H, Tq, _ = Q.shape
    S = _scores_on_device(Q, K, mask, scale)
    A = cuda.device_array_like(S)
    softmax_kernel[_grid(B * H * Tq)](S, A)
    out = cuda.device_array((B, H, Tq, V.shape[3]), dtype=Q.dtype)
    weighted_sum_kernel[_grid(out.size)](A, _to_device(V, Q.dtype), out)
    return out, A, S


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + M)`` and ``out = A V`` -> (out (B, H, Tq, d_v), A (B, H, Tq, Tk))."""
    out, A, _ = _attention_on_device(Q, K, V, mask, scale)
    return out.copy_to_host(), A.copy_to_host()


def attention_with_scores(Q, K, V, mask, scale):
    """:func:`attention_with_weights`, and the scores ``S = Q K^T * scale + M`` it took the softmax of
    -> (out (B, H, Tq, d_v), A (B, H, Tq, Tk), S (B, H, Tq, Tk))."""
    out, A, S = _attention_on_device(Q, K, V, mask, scale)
    return out.copy_to_host(), A.copy_to_host(), S.copy_to_host()


def weighted_sum(A, V):
    """``out = A V`` -> (B, H, Tq, d_v)."""
    out = cuda.device_array(A.shape[:3] + (V.shape[3],), dtype=A.dtype)
    weighted_sum_kernel[_grid(out.size)](_to_device(A, A.dtype), _to_device(V, A.dtype), out)
    return out.copy_to_host()


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + M) V`` without materialising the (Tq, Tk) weights -> (B, H, Tq, d_v)."""
    B, H, Tq, d_k = Q.shape
    d_v, dt = V.shape[3], Q.dtype
    out = cuda.device_array((B, H, Tq, d_v), dtype=dt)
    # the K and V tiles must fit in shared memory: fewer keys per tile for very wide heads
    tile = max(1, min(TILE, SHARED_BYTES // ((d_k + d_v) * dt.itemsize)))
    kernel = fused_attention_kernel(dt, tile, d_k, d_v)
    grid = (max(1, -(-Tq // THREADS)), B * H)          # (query blocks, heads of every batch)
    kernel[grid, THREADS](_to_device(Q, dt), _to_device(K, dt), _to_device(V, dt),
                          _to_device(mask, dt), dt.type(scale), out)
    return out.copy_to_host()


def project_heads(X, W, b, n_heads):
    """``X W + b`` split into heads: X (B, T, d_in), W (d_in, H*d), b (H*d,) -> (B, H, T, d)."""
    B, T, _ = X.shape
    dt = X.dtype
    out = cuda.device_array((B, n_heads, T, W.shape[1] // n_heads), dtype=dt)
    project_heads_kernel[_grid(out.size)](_to_device(X, dt), _to_device(W, dt), _to_device(b, dt), out)
    return out.copy_to_host()


def merge_heads_project(O, W_O, b_O):
    """``Concat(O_1..O_H) W_O + b_O``: O (B, H, T, d_v) -> (B, T, d_out)."""
    B, _, T, _ = O.shape
    dt = O.dtype
    out = cuda.device_array((B, T, W_O.shape[1]), dtype=dt)
    merge_heads_project_kernel[_grid(out.size)](_to_device(O, dt), _to_device(W_O, dt),
                                                _to_device(b_O, dt), out)
    return out.copy_to_host()


def sinusoidal(T, d_model, base, dtype):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))`` -> (T, d_model)."""
    PE = cuda.device_array((T, d_model), dtype=np.dtype(dtype))
    sinusoidal_kernel[_grid(T * d_model)](float(base), PE)
    return PE.copy_to_host()
