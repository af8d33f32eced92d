"""Numba CUDA kernels for attention, and the host drivers that launch them.

Same host functions, names and signatures as ``core.kernels.tuned.cpu``; ``core.attention`` dispatches to one
or the other. Drivers take validated, C-contiguous NumPy arrays of one dtype (float32 or float64)
and return NumPy arrays of that dtype. Shapes: ``(B, H, Tq, Tk)`` for scores and weights,
``(B, H, T, d)`` for per-head activations. Masks are additive and 4-D, each dimension either 1
(broadcast) or full size.

Kernels are built by small factories cached per ``(dtype, tile, ...)``: shared and local arrays
need compile-time shapes, and constants such as ``0`` and ``-inf`` must be typed in the array's
own precision so that float32 data is computed in float32 (a bare ``0.0`` is a float64 in Numba).
No ``fastmath`` anywhere: masks rely on ``-inf`` arithmetic.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import cuda

from core.kernels.warm_inputs import tiny_inputs

# Tunables, in one place and read at launch time, so tests can patch them small.
THREADS = 128   # threads per block for one-thread-per-element / per-row kernels and fused queries
TILE = 16       # keys per shared-memory tile (fused attention); side of a matmul tile (TILE x TILE)
SHARED_BYTES = 48 * 1024   # static shared memory a block may use; wide heads get shorter key tiles


def _blocks(n: int, threads: int) -> int:
    """Number of blocks of ``threads`` that cover ``n`` items (at least one)."""
    return max(1, -(-n // threads))


# --------------------------------------------------------------------------- device helpers

@cuda.jit(device=True)
def _mask_at(mask, b, h, i, j):
    """Additive mask entry for ``(b, h, i, j)``; a size-1 dimension broadcasts."""
    return mask[b if mask.shape[0] > 1 else 0,
                h if mask.shape[1] > 1 else 0,
                i if mask.shape[2] > 1 else 0,
                j if mask.shape[3] > 1 else 0]


@cuda.jit(device=True)
def _score(Q, K, mask, scale, b, h, i, j):
    """``S_ij = (q_i . k_j) * scale + M_ij`` for one head."""
    dot = Q[b, h, i, 0] * K[b, h, j, 0]   # start from the first term: keeps the inputs' dtype
    for c in range(1, Q.shape[3]):
        dot += Q[b, h, i, c] * K[b, h, j, c]
    return dot * scale + _mask_at(mask, b, h, i, j)


@cuda.jit(device=True)
def _softmax_row(src, dst, zero):
    """``dst = softmax(src)`` for one row (may be the same row); all ``-inf`` gives zeros."""
    # 1. the row max, so that exp never overflows
    row_max = src[0]
    for j in range(1, src.shape[0]):
        row_max = max(row_max, src[j])
    if row_max == -math.inf:          # nothing allowed: zero weights, not 0/0 = NaN
        for j in range(dst.shape[0]):
            dst[j] = zero
        return
    # 2. exponentiate and sum; 3. normalise
    total = zero
    for j in range(src.shape[0]):
        e = math.exp(src[j] - row_max)
        dst[j] = e
        total += e
    for j in range(dst.shape[0]):
        dst[j] = dst[j] / total


@cuda.jit(device=True)
def _tile_product(A_tile, B_tile, row, col, acc):
    """``acc + sum_k A_tile[row, k] * B_tile[k, col]`` over one shared-memory tile."""
    for k in range(A_tile.shape[1]):
        acc += A_tile[row, k] * B_tile[k, col]
    return acc


# --------------------------------------------------------------------------- kernels

@cuda.jit
def _scaled_scores_kernel(Q, K, mask, scale, S):
    # one thread per score S[b, h, i, j]; no typed constants needed, so no factory
    B, H, Tq, Tk = S.shape
    n = cuda.grid(1)
    if n < B * H * Tq * Tk:
        j = n % Tk
        i = (n // Tk) % Tq
        h = (n // (Tk * Tq)) % H
        b = n // (Tk * Tq * H)
        S[b, h, i, j] = _score(Q, K, mask, scale, b, h, i, j)


@functools.lru_cache(maxsize=None)
def _softmax_rows_kernel(dtype):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _softmax_rows_kernel(S, A):
        # one thread per row (b, h, i)
        B, H, Tq, _ = S.shape
        row = cuda.grid(1)
        if row < B * H * Tq:
            b, h, i = row // (H * Tq), (row // Tq) % H, row % Tq
            _softmax_row(S[b, h, i], A[b, h, i], real(0))
    return _softmax_rows_kernel


@functools.lru_cache(maxsize=None)
def _attention_weights_kernel(dtype):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _attention_weights_kernel(Q, K, mask, scale, A):
        # one thread per row: scores into A's row, then softmax in place (no separate S array)
        B, H, Tq, Tk = A.shape
        row = cuda.grid(1)
        if row < B * H * Tq:
            b, h, i = row // (H * Tq), (row // Tq) % H, row % Tq
            for j in range(Tk):
                A[b, h, i, j] = _score(Q, K, mask, scale, b, h, i, j)
            _softmax_row(A[b, h, i], A[b, h, i], real(0))
    return _attention_weights_kernel


@functools.lru_cache(maxsize=None)
def _weighted_sum_kernel(dtype):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _weighted_sum_kernel(A, V, out):
        # one thread per output entry: out[b, h, i, c] = sum_j A[b, h, i, j] V[b, h, j, c]
        B, H, Tq, dv = out.shape
        n = cuda.grid(1)
        if n < B * H * Tq * dv:
            c = n % dv
            i = (n // dv) % Tq
            h = (n // (dv * Tq)) % H
            b = n // (dv * Tq * H)
            acc = real(0)
            for j in range(A.shape[3]):
                acc += A[b, h, i, j] * V[b, h, j, c]
            out[b, h, i, c] = acc
    return _weighted_sum_kernel


@functools.lru_cache(maxsize=None)
def _fused_attention_kernel(dtype, tile, d_k, d_v):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _fused_attention_kernel(Q, K, V, mask, scale, out):
        # grid (query blocks, B*H); one thread per query row i; keys visited tile by tile
        H, Tq, Tk = Q.shape[1], Q.shape[2], K.shape[2]
        b, h = cuda.blockIdx.y // H, cuda.blockIdx.y % H
        t, n_threads = cuda.threadIdx.x, cuda.blockDim.x
        i = cuda.blockIdx.x * n_threads + t
        active = i < Tq               # idle threads still load tiles and meet the barriers

        K_tile = cuda.shared.array((tile, d_k), real)   # (tile, d_k), shared by the block
        V_tile = cuda.shared.array((tile, d_v), real)   # (tile, d_v)
        q = cuda.local.array(d_k, real)                 # this thread's query row
        s = cuda.local.array(tile, real)                # its scores against one tile
        acc = cuda.local.array(d_v, real)               # unnormalised output sum_j p_j v_j
        for c in range(d_k):
            q[c] = Q[b, h, i, c] if active else real(0)
        for c in range(d_v):
            acc[c] = real(0)
        neg_inf = real(-math.inf)
        m = neg_inf                   # running max of the row's scores
        l = real(0)                   # running sum of exp(s_j - m)

        for k0 in range(0, Tk, tile):
            n_keys = min(tile, Tk - k0)
            # 1. the block loads K and V rows k0 .. k0+n_keys together
            for e in range(t, n_keys * d_k, n_threads):
                K_tile[e // d_k, e % d_k] = K[b, h, k0 + e // d_k, e % d_k]
            for e in range(t, n_keys * d_v, n_threads):
                V_tile[e // d_v, e % d_v] = V[b, h, k0 + e // d_v, e % d_v]
            cuda.syncthreads()

            if active:
                # 2. this tile's scores and their max
                tile_max = neg_inf
                for jj in range(n_keys):
                    dot = real(0)
                    for c in range(d_k):
                        dot += q[c] * K_tile[jj, c]
                    s[jj] = dot * scale + _mask_at(mask, b, h, i, k0 + jj)
                    tile_max = max(tile_max, s[jj])
                m_new = max(m, tile_max)
                # while every key so far is masked the row has nothing to add
                if m_new != neg_inf:
                    # 3. rescale the running sums to the new max (alpha = 0 the first time)
                    alpha = math.exp(m - m_new)
                    l *= alpha
                    for c in range(d_v):
                        acc[c] *= alpha
                    # 4. add this tile's keys
                    for jj in range(n_keys):
                        p = math.exp(s[jj] - m_new)
                        l += p
                        for c in range(d_v):
                            acc[c] += p * V_tile[jj, c]
                    m = m_new
            cuda.syncthreads()        # nobody overwrites the tile while others still read it

        if active:
            # 5. normalise once at the end; a fully masked row has l = 0 and outputs zeros
            for c in range(d_v):
                out[b, h, i, c] = acc[c] / l if l > real(0) else real(0)
    return _fused_attention_kernel


@functools.lru_cache(maxsize=None)
def _project_heads_kernel(dtype, tile):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _project_heads_kernel(X, W, bias, out):
        # Y = X W + b as a tiled matmul; X is (B*T, d_in): row r is (batch r // T, position r % T);
        # column c of Y belongs to head c // d, feature c % d, and is stored straight there.
        M, d_in = X.shape
        N = W.shape[1]
        T, d = out.shape[2], out.shape[3]
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        r = cuda.blockIdx.y * tile + ty
        c = cuda.blockIdx.x * tile + tx

        X_tile = cuda.shared.array((tile, tile), real)
        W_tile = cuda.shared.array((tile, tile), real)
        acc = real(0)
        for k0 in range(0, d_in, tile):
            # zero padding past the edges lets every thread take part in every barrier
            X_tile[ty, tx] = X[r, k0 + tx] if r < M and k0 + tx < d_in else real(0)
            W_tile[ty, tx] = W[k0 + ty, c] if k0 + ty < d_in and c < N else real(0)
            cuda.syncthreads()
            acc = _tile_product(X_tile, W_tile, ty, tx, acc)
            cuda.syncthreads()
        if r < M and c < N:
            out[r // T, c // d, r % T, c % d] = acc + bias[c]
    return _project_heads_kernel


@functools.lru_cache(maxsize=None)
def _merge_heads_project_kernel(dtype, tile):
    real = numba.from_dtype(dtype)

    @cuda.jit
    def _merge_heads_project_kernel(O, W_O, bias, out):
        # Y = Concat(O) W_O + b as a tiled matmul. Concat(O)[r, k] = O[r//T, k//dv, r%T, k%dv] is
        # read straight from the heads, so the (B*T, H*dv) concatenation is never built.
        H, T, dv = O.shape[1], O.shape[2], O.shape[3]
        M, N = out.shape
        K = H * dv
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        r = cuda.blockIdx.y * tile + ty
        c = cuda.blockIdx.x * tile + tx

        O_tile = cuda.shared.array((tile, tile), real)
        W_tile = cuda.shared.array((tile, tile), real)
        acc = real(0)
        for k0 in range(0, K, tile):
            k = k0 + tx
            O_tile[ty, tx] = O[r // T, k // dv, r % T, k % dv] if r < M and k < K else real(0)
            W_tile[ty, tx] = W_O[k0 + ty, c] if k0 + ty < K and c < N else real(0)
            cuda.syncthreads()
            acc = _tile_product(O_tile, W_tile, ty, tx, acc)
            cuda.syncthreads()
        if r < M and c < N:
            out[r, c] = acc + bias[c]
    return _merge_heads_project_kernel


@cuda.jit
def _sinusoidal_kernel(base, PE):
    # one thread per entry PE[p, c]; the angle is computed in float64 whatever PE's dtype,
    # because p / base**(2i/d) loses digits fastest for large p (rounded once, at the store)
    T, d = PE.shape
    n = cuda.grid(1)
    if n < T * d:
        p, c = n // d, n % d
        two_i = c - c % 2
        angle = p / math.pow(base, two_i / d)
        PE[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)


# Which kernel (or kernel factory) each driver launches; its source is shown on the pages.
KERNELS = {
    "scaled_scores": _scaled_scores_kernel, "softmax_rows": _softmax_rows_kernel,
    "attention_weights": _attention_weights_kernel, "weighted_sum": _weighted_sum_kernel,
    "attention_with_weights": _attention_weights_kernel, "fused_attention": _fused_attention_kernel,
    "project_heads": _project_heads_kernel, "merge_heads_project": _merge_heads_project_kernel,
    "sinusoidal": _sinusoidal_kernel,
}


# --------------------------------------------------------------------------- host drivers

def _to_device(arr, dtype):
    """Copy to the device, C-contiguous and in the computation's dtype (a no-op conversion for
    validated inputs; a stray float64 mask would otherwise promote float32 arithmetic)."""
    return cuda.to_device(np.ascontiguousarray(arr, dtype=dtype))


def scaled_scores(Q, K, mask, scale):
    """``S = Q K^T * scale + mask``: Q (B,H,Tq,dk), K (B,H,Tk,dk) -> S (B,H,Tq,Tk)."""
    B, H, Tq, _ = Q.shape
    Tk, dt = K.shape[2], Q.dtype
    S = cuda.device_array((B, H, Tq, Tk), dtype=dt)
    _scaled_scores_kernel[_blocks(B * H * Tq * Tk, THREADS), THREADS](
        _to_device(Q, dt), _to_device(K, dt), _to_device(mask, dt), dt.type(scale), S)
    return S.copy_to_host()


def softmax_rows(S):
    """Row-wise softmax over the last axis of (B,H,Tq,Tk); an all ``-inf`` row gives zeros."""
    B, H, Tq, _ = S.shape
    A = cuda.device_array(S.shape, dtype=S.dtype)
    kernel = _softmax_rows_kernel(S.dtype)
    kernel[_blocks(B * H * Tq, THREADS), THREADS](_to_device(S, S.dtype), A)
    return A.copy_to_host()


def attention_weights(Q, K, mask, scale):
    """``A = softmax(Q K^T * scale + mask)`` in one kernel: -> (B,H,Tq,Tk)."""
    B, H, Tq, _ = Q.shape
    Tk, dt = K.shape[2], Q.dtype
    A = cuda.device_array((B, H, Tq, Tk), dtype=dt)
    kernel = _attention_weights_kernel(dt)
    kernel[_blocks(B * H * Tq, THREADS), THREADS](
        _to_device(Q, dt), _to_device(K, dt), _to_device(mask, dt), dt.type(scale), A)
    return A.copy_to_host()


def weighted_sum(A, V):
    """``out = A V``: A (B,H,Tq,Tk), V (B,H,Tk,dv) -> (B,H,Tq,dv)."""
    B, H, Tq, _ = A.shape
    dv, dt = V.shape[3], A.dtype
    out = cuda.device_array((B, H, Tq, dv), dtype=dt)
    kernel = _weighted_sum_kernel(dt)
    kernel[_blocks(B * H * Tq * dv, THREADS), THREADS](_to_device(A, dt), _to_device(V, dt), out)
    return out.copy_to_host()


def attention_with_weights(Q, K, V, mask, scale):
    """``A = softmax(Q K^T * scale + mask)`` and ``out = A V``; A stays on the device in between."""
    B, H, Tq, _ = Q.shape
    Tk, dv, dt = K.shape[2], V.shape[3], Q.dtype
    A = cuda.device_array((B, H, Tq, Tk), dtype=dt)
    _attention_weights_kernel(dt)[_blocks(B * H * Tq, THREADS), THREADS](
        _to_device(Q, dt), _to_device(K, dt), _to_device(mask, dt), dt.type(scale), A)
    out = cuda.device_array((B, H, Tq, dv), dtype=dt)
    _weighted_sum_kernel(dt)[_blocks(B * H * Tq * dv, THREADS), THREADS](A, _to_device(V, dt), out)
    return out.copy_to_host(), A.copy_to_host()


def fused_attention(Q, K, V, mask, scale):
    """``softmax(Q K^T * scale + mask) V`` with an online softmax over key tiles -> (B,H,Tq,dv).

    Never materialises the (Tq, Tk) scores; a fully masked row gives a zero output.
    """
    B, H, Tq, d_k = Q.shape
    d_v, dt = V.shape[3], Q.dtype
    out = cuda.device_array((B, H, Tq, d_v), dtype=dt)
    # the K and V tiles must fit in shared memory: fewer keys per tile for very wide heads
    tile = max(1, min(TILE, SHARED_BYTES // ((d_k + d_v) * dt.itemsize)))
    kernel = _fused_attention_kernel(dt, tile, d_k, d_v)
    grid = (_blocks(Tq, THREADS), B * H)          # (query blocks, heads of every batch)
    kernel[grid, THREADS](_to_device(Q, dt), _to_device(K, dt), _to_device(V, dt),
                          _to_device(mask, dt), dt.type(scale), out)
    return out.copy_to_host()


def project_heads(X, W, b, n_heads):
    """``split_heads(X W + b)``: X (B,T,d_in), W (d_in, H*d), b (H*d,) -> (B,H,T,d)."""
    B, T, d_in = X.shape
    N, dt = W.shape[1], X.dtype
    out = cuda.device_array((B, n_heads, T, N // n_heads), dtype=dt)
    X2 = X.reshape(B * T, d_in)                   # (B*T, d_in): one row per (batch, position)
    kernel = _project_heads_kernel(dt, TILE)
    grid = (_blocks(N, TILE), _blocks(B * T, TILE))   # x over output columns, y over rows
    kernel[grid, (TILE, TILE)](_to_device(X2, dt), _to_device(W, dt), _to_device(b, dt), out)
    return out.copy_to_host()


def merge_heads_project(O, W_O, b_O):
    """``Concat(O) W_O + b_O``: O (B,H,T,dv), W_O (H*dv, d_out), b_O (d_out,) -> (B,T,d_out)."""
    B, _, T, _ = O.shape
    d_out, dt = W_O.shape[1], O.dtype
    out = cuda.device_array((B * T, d_out), dtype=dt)
    kernel = _merge_heads_project_kernel(dt, TILE)
    grid = (_blocks(d_out, TILE), _blocks(B * T, TILE))
    kernel[grid, (TILE, TILE)](_to_device(O, dt), _to_device(W_O, dt), _to_device(b_O, dt), out)
    return out.copy_to_host().reshape(B, T, d_out)   # (B, T, d_out)


def sinusoidal(T, d_model, base, dtype):
    """``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(...)`` -> (T, d_model)."""
    PE = cuda.device_array((T, d_model), dtype=np.dtype(dtype))
    _sinusoidal_kernel[_blocks(T * d_model, THREADS), THREADS](float(base), PE)
    return PE.copy_to_host()


def warm_up(dtype) -> None:
    """Compile every kernel for one dtype by running each driver once on tiny inputs."""
    dtype = np.dtype(dtype)
    X4, X3, W, b, mask = tiny_inputs(dtype)
    attention_with_weights(X4, X4, X4, mask, 1.0)
    scaled_scores(X4, X4, mask, 1.0)
    softmax_rows(X4)
    fused_attention(X4, X4, X4, mask, 1.0)
    project_heads(X3, W, b, 1)
    merge_heads_project(X4, W, b)
    sinusoidal(2, 2, 10000.0, dtype)
