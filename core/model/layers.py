"""The sublayers of a post-norm transformer, each as a forward and a hand-written backward pass.

Written like the formulas: NumPy for the shapes, and small compiled loops (Numba) where a step
would otherwise be a dozen NumPy calls on tiny arrays (the attention rows, LayerNorm) or a matrix
product (our own, for the same bits on a busy server). Each compiled loop has its NumPy formula
beside it, which runs while a freshly started server still compiles the loop in the background
(:func:`core.readiness.can_run`): a page never waits for the compiler, and the two agree to
rounding (tests hold them to 1e-12 in float64). Every forward returns ``(output, cache)``;
the matching backward takes the gradient of the output and that cache, and returns the gradients
of the inputs and of the parameters. Shapes: activations ``(B, T, d)``, attention weights
``(B, H, Tq, Tk)``; weights are ``(d_in, d_out)`` applied as ``X @ W``.

Multi-head attention, the sublayer with the most steps, has a module of its own
(:mod:`core.model.multi_head`).
"""
from __future__ import annotations

import functools
import math
import os
import weakref

import numpy as np
from numba import njit, prange

from core import limits
from core.kernels import cpu as lesson_cpu
from core.kernels.tuned.fastexp import gelu_erf as gelu_erf_f32
from core.model.compact import CompactMatrix
from core.recording import note, recording  # noqa: F401  (recording: what the model pages wrap a forward pass in)
from core.readiness import can_run

ATTENTION_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def compiled_or(kernel, twin, *args) -> None:
    """``kernel(*args)``, or its NumPy ``twin(*args)`` (the same formula, the same outputs written)
    while a freshly started server still compiles ``kernel`` in the background."""
    chosen = kernel if can_run(kernel, *args) else twin
    note(chosen)
    chosen(*args)


# ----------------------------------------------------------------------------------------------
# matrix products
# ----------------------------------------------------------------------------------------------
@njit(inline="always", cache=True, nogil=True)
def _batch_product(A, B, C, n):
    """``C[n] = A[n] B[n]``."""
    for i in range(A.shape[1]):
        C[n, i, :] = 0
        for p in range(A.shape[2]):
            a = A[n, i, p]
            for j in range(B.shape[2]):              # contiguous: LLVM gives it SIMD lanes
                C[n, i, j] += a * B[n, p, j]


@njit(cache=True, nogil=True)
def _matmul_batches(A, B, C):
    """``C[n] = A[n] B[n]`` for each n: A (N, r, k), B (N, k, c) -> C (N, r, c)."""
    for n in range(A.shape[0]):
        _batch_product(A, B, C, n)


@njit(cache=True, nogil=True, parallel=True)
def _matmul_batches_threaded(A, B, C):
    """:func:`_matmul_batches` with the batches (a model's heads) shared among Numba's threads, each
    batch one thread's: the same bits."""
    for n in prange(A.shape[0]):
        _batch_product(A, B, C, n)


# A loaded model's attention products with this many rows a batch (queries, or a group's queries)
# go through the matrix product's register tile (core.kernels.tuned.gemm), fewer through the loop above.
TILED_BATCH_ROWS = 4


def matmul(a: np.ndarray, b: np.ndarray, threaded: bool = False) -> np.ndarray:
    """``a @ b`` for ``(..., r, k) @ (..., k, c)`` with the same leading axes (or ``b`` 2-D);
    ``threaded``: the batches shared among Numba's threads (a loaded model's attention products).

    Our own loops, not NumPy's BLAS: OpenBLAS has one thread count for the whole process, and its
    threads contend on a shared server; a serial compiled loop gives the same bits whatever else the
    process is doing. Two 2-D operands (every linear layer and its gradients, 512 x 32 by 32 x 96 in
    training) go to the encoder's register-tiled product, 3-4x faster than the plain loop here.
    """
    if a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype:
        return _matmul_tiled(a, b)
    lead = a.shape[:-2]
    if b.ndim == 2:
        b = np.broadcast_to(b, lead + b.shape)
    A = np.ascontiguousarray(a).reshape(-1, a.shape[-2], a.shape[-1])     # (N, r, k)
    B = np.ascontiguousarray(b).reshape(-1, b.shape[-2], b.shape[-1])     # (N, k, c)
    if threaded and A.shape[1] >= TILED_BATCH_ROWS and A.dtype == B.dtype:
        C = gemm().matmul_batched_if_loaded(A, B)             # the register tile, every batch's tiles shared
        if C is not None:
            note(gemm().matmul_batched_if_loaded)
            return C.reshape(lead + C.shape[1:])
    C = np.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=np.result_type(a, b))
    loop = _matmul_batches_threaded if threaded else _matmul_batches
    if not can_run(loop, A, B, C):
        return np.matmul(a, b)                    # the loop still compiles: NumPy's product meanwhile
    loop(A, B, C)
    return C.reshape(lead + C.shape[1:])


def _matmul_tiled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with ``compiled.products.project`` (``Y = A^T X``, the SIMD lanes along X's rows).
    A result narrower than it is tall and narrower than a tile (the 11 logits of a token) is
    computed transposed, ``(a b)^T = b^T a^T``, so its long side fills the lanes."""
    from core.model.tuned.products import project     # tuned kernels: loaded when training needs them

    r, c = a.shape[0], b.shape[1]
    if c >= r or c >= 24:
        A, X, y = a.T, np.ascontiguousarray(b), np.empty((r, c), dtype=a.dtype)
    else:
        A, X, y = b, np.ascontiguousarray(a.T), np.empty((c, r), dtype=a.dtype)
    if not can_run(project, A, X, y, y, False):
        return a @ b                              # the product still compiles: NumPy's meanwhile
    project(A, X, y, y, False)
    return y if y.shape == (r, c) else y.T


@functools.lru_cache(maxsize=64)
def sinusoid_table(T: int, d: int, dtype_str: str) -> np.ndarray:
    """``PE (T, d)`` from the lesson's CPU kernel (:func:`core.positional.sinusoidal`), computed in
    float64 and rounded once to the parameters' dtype; cached and read-only, as every forward pass
    of a given length adds the same table."""
    table = np.empty((T, d), dtype=np.float64)
    compiled_or(lesson_cpu.sinusoidal_kernel, _sinusoid_numpy, 10000.0, table)
    table = table.astype(np.dtype(dtype_str))
    table.setflags(write=False)
    return table


def _sinusoid_numpy(base, PE):
    """:func:`core.kernels.cpu.sinusoidal_kernel` over whole arrays."""
    T, d = PE.shape
    c = np.arange(d)
    angle = np.arange(T)[:, None] / base ** ((c - c % 2) / d)      # both columns of a pair share one angle
    PE[...] = np.where(c % 2 == 0, np.sin(angle), np.cos(angle))


# ----------------------------------------------------------------------------------------------
# linear layers
# ----------------------------------------------------------------------------------------------
# A weight matrix this large (362 x 362) goes to BLAS; a smaller one to our own compiled product
# (:func:`matmul`), on the calling thread. Every layer of GPT-2 and of all-MiniLM-L6-v2 (384 wide)
# is above it, and BLAS's threads make those fast (MiniLM at T = 128: 25 ms a forward pass against
# 36 ms with its 384 x 384 products on our own). Every model the pages train (64 wide at most) is
# far below it, for two reasons: its numbers stay the same bits whatever else the server does
# (BLAS's can change with its thread count, which another session may change), and OpenBLAS splits
# even a 1024 x 32 x 32 product among threads that, on a busy server, wait for cores (15 ms per
# product under load, not microseconds).
BLAS_FROM = 1 << 17


def product(a: np.ndarray, b: np.ndarray, big: bool, threaded: bool = False) -> np.ndarray:
    """``a @ b``: BLAS for a big model, our own compiled product for a small one (see ``BLAS_FROM``),
    on Numba's threads if ``threaded``."""
    return a @ b if big else matmul(np.ascontiguousarray(a), np.ascontiguousarray(b), threaded)


# A real model's weights, packed once at load for our own product (core.kernels.tuned.gemm), found
# here by the weight they were packed from, for as long as it lives; a weight not packed (a model
# the pages train, a weight widened from a compact file for one pass) keeps the products above.
_PACKED: dict[tuple[int, bool], object] = {}


def pack_weights(params: dict, transposed: tuple[str, ...] = (), budget_mb: float | None = None) -> bool:
    """Pack every weight matrix (``*.W*``, ``unembed``) of ``params`` that BLAS would multiply
    (``BLAS_FROM``), and the transposes of the ``transposed`` ones (a tied unembedding reads the token
    table as ``E^T``), float32 or float64; each is made read-only, so a packed copy cannot go stale.
    Nothing is packed when the copies would take more than ``budget_mb`` (default: the environment's
    ``ATTENTION_PACKED_MB``, else ``core.limits.MAX_PACKED_MB``). Returns whether the model is packed."""
    if budget_mb is None:
        budget_mb = float(os.environ.get("ATTENTION_PACKED_MB", limits.MAX_PACKED_MB))
    chosen = [(name, W) for name, W in params.items()
              if isinstance(W, np.ndarray) and W.ndim == 2 and W.size >= BLAS_FROM and W.dtype.kind == "f"
              and (name in transposed or name.rsplit(".", 1)[-1].startswith("W") or name == "unembed")]
    if not chosen or sum(W.nbytes for _, W in chosen) > budget_mb * 1e6:
        return False
    for name, W in chosen:
        key = (id(W), name in transposed)
        if key not in _PACKED:
            W.setflags(write=False)
            _PACKED[key] = gemm().pack(W.T if key[1] else W)
            weakref.finalize(W, _PACKED.pop, key, None)
    return True


def gemm():
    """:mod:`core.kernels.tuned.gemm`, imported when a packed weight is first used (the lesson pages never)."""
    from core.kernels.tuned import gemm as module
    return module


def packed(W, transposed: bool = False):
    """``W`` (or ``W^T``) as :func:`pack_weights` packed it, or None."""
    return _PACKED.get((id(W), transposed))


def own_products(W) -> bool:
    """Whether a layer's products with ``W`` run on our own kernels and Numba's threads (a packed
    weight, a compact one), so that the attention products beside them had better too: Numba's
    threads and BLAS's would take turns spinning on the same cores."""
    return packed(W) is not None or isinstance(W, CompactMatrix)


def packed_product(rows: np.ndarray, P, b=None, activation: str = "none") -> np.ndarray | None:
    """``act(rows @ W + b)`` through our product on ``W`` packed (``P``), or None while the warm-up
    still compiles it (the caller's BLAS product then)."""
    y = gemm().matmul_if_loaded(rows, P, b, activation)
    if y is not None:
        note(gemm().matmul)
    return y


def dense(x: np.ndarray, W: np.ndarray, b) -> np.ndarray:
    """``x @ W + b`` over the last axis, as one 2-D product; ``b`` may be None (a model without biases).
    A packed weight goes through our own product, its bias added to each tile; a compact one
    (:class:`~core.model.compact.CompactMatrix`) through its own product where it has one, else widened."""
    if isinstance(W, CompactMatrix):
        y = W.product(x.reshape(-1, x.shape[-1]), b)
        if y is not None:
            return y.reshape(*x.shape[:-1], W.shape[1])
        W = W.widen()
    P = packed(W)
    y = None if P is None else packed_product(x.reshape(-1, x.shape[-1]), P, b)
    if y is not None:
        return y.reshape(*x.shape[:-1], W.shape[1])
    y = product(x.reshape(-1, x.shape[-1]), W, W.size >= BLAS_FROM).reshape(*x.shape[:-1], W.shape[1])
    if b is not None:
        y += b                      # in place: a fresh array and a pass fewer (the same numbers)
    return y


def dense_activated(x: np.ndarray, W: np.ndarray, b, activation: str) -> np.ndarray | None:
    """``act(x @ W + b)`` over the last axis in one product, the activation applied to each tile while
    it is in the cache, where ``W`` is packed and our product has the activation (float32 for the
    exact GELU); None otherwise: the caller takes :func:`dense`, then the activation."""
    P = packed(W)
    if P is None or activation not in gemm().ACTIVATIONS or (activation == "gelu_erf" and P.dtype != np.float32):
        return None
    y = packed_product(x.reshape(-1, x.shape[-1]), P, b, activation)
    return None if y is None else y.reshape(*x.shape[:-1], W.shape[1])


def dense_joined(x: np.ndarray, Ws, gated: bool = False, biases=None) -> np.ndarray | None:
    """``x @ [W_0 | W_1 | ...] + [b_0 | b_1 | ...]`` over the last axis, the weights' outputs side by
    side, or ``gated``: ``silu(x W_0) * (x W_1)``, as one product where the weights have one together:
    ``x`` is laid out and the work shared among the threads once, not once a weight. That is packed
    float weights (:func:`core.kernels.tuned.gemm.joined_matmul_if_loaded`, with their biases), or a
    quantised checkpoint's of one format (:meth:`~core.model.compact.CompactMatrix.joined_product`,
    without biases). None otherwise: the caller multiplies them one by one."""
    biases = [b for b in biases or () if b is not None]
    if biases and len(biases) < len(Ws):
        return None                                      # some weights with a bias and some without
    x2, first = x.reshape(-1, x.shape[-1]), Ws[0]
    if isinstance(first, CompactMatrix):
        y = None if biases else first.joined_product(x2, Ws, gated)
    else:
        Ps = [packed(W) for W in Ws]
        y = None if gated or None in Ps else \
            gemm().joined_matmul_if_loaded(x2, Ps, np.concatenate(biases) if biases else None)
    return None if y is None else y.reshape(*x.shape[:-1], y.shape[1])


def linear_backward(dy: np.ndarray, x: np.ndarray, W: np.ndarray):
    """Gradients of ``y = x W + b``: ``(dx, dW, db)``; leading axes of ``x`` are summed for dW, db."""
    x2 = x.reshape(-1, x.shape[-1])                                 # (N, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])                              # (N, d_out)
    dx = matmul(dy2, W.T).reshape(x.shape)
    return dx, matmul(x2.T, dy2), dy2.sum(axis=0)


# ----------------------------------------------------------------------------------------------
# layer norm and the position-wise feed-forward network
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _layer_norm_rows(x, g, b, eps, y, xhat, rstd):
    """For every row n of ``x (N, d)``: ``mu``, ``var`` over the row, ``rstd[n] = 1 / sqrt(var + eps)``,
    ``xhat[n] = (x[n] - mu) * rstd[n]``, ``y[n] = xhat[n] * g + b``."""
    N, d = x.shape
    for n in range(N):
        mu = 0.0
        for c in range(d):
            mu += x[n, c]
        mu /= d
        var = 0.0
        for c in range(d):
            var += (x[n, c] - mu) ** 2
        r = 1.0 / math.sqrt(var / d + eps)
        rstd[n] = r
        for c in range(d):
            xhat[n, c] = (x[n, c] - mu) * r
            y[n, c] = xhat[n, c] * g[c] + b[c]


@njit(cache=True, nogil=True)
def _layer_norm_rows_backward(dy, xhat, rstd, g, dx, dg, db):
    """Gradients of :func:`_layer_norm_rows`, row by row, with ``dxhat = dy * g``:
    ``dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))``; ``dg, db`` summed over the rows."""
    N, d = dy.shape
    dg[:] = 0.0
    db[:] = 0.0
    for n in range(N):
        m1 = 0.0
        m2 = 0.0
        for c in range(d):
            dxhat = dy[n, c] * g[c]
            m1 += dxhat
            m2 += dxhat * xhat[n, c]
            dg[c] += dy[n, c] * xhat[n, c]
            db[c] += dy[n, c]
        m1 /= d
        m2 /= d
        for c in range(d):
            dx[n, c] = rstd[n] * (dy[n, c] * g[c] - m1 - xhat[n, c] * m2)


def _layer_norm_rows_numpy(x, g, b, eps, y, xhat, rstd):
    """:func:`_layer_norm_rows` over whole arrays."""
    mu = x.mean(axis=1, keepdims=True)
    rstd[:] = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=1) + eps)
    xhat[...] = (x - mu) * rstd[:, None]
    y[...] = xhat * g + b


def _layer_norm_rows_backward_numpy(dy, xhat, rstd, g, dx, dg, db):
    """:func:`_layer_norm_rows_backward` over whole arrays."""
    dxhat = dy * g
    m1 = dxhat.mean(axis=1, keepdims=True)
    m2 = (dxhat * xhat).mean(axis=1, keepdims=True)
    dg[:] = (dy * xhat).sum(axis=0)
    db[:] = dy.sum(axis=0)
    dx[...] = rstd[:, None] * (dxhat - m1 - xhat * m2)


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float):
    r"""``y = g * (x - mu) / sqrt(var + eps) + b`` over the last axis; returns ``(y, cache)``."""
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])           # (N, d)
    y, xhat, rstd = np.empty_like(rows), np.empty_like(rows), np.empty(len(rows), dtype=rows.dtype)
    compiled_or(_layer_norm_rows, _layer_norm_rows_numpy, rows, g, b, eps, y, xhat, rstd)
    return y.reshape(x.shape), {"xhat": xhat, "rstd": rstd, "g": g}


@njit(cache=True, nogil=True)
def _rms_norm_rows(x, g, eps, y, xhat, rms):
    """For every row n of ``x (N, d)``: ``rms[n] = sqrt(mean(x[n]^2) + eps)``, ``xhat[n] = x[n] / rms[n]``,
    ``y[n] = xhat[n] * g``."""
    N, d = x.shape
    for n in range(N):
        ms = 0.0
        for c in range(d):
            ms += x[n, c] * x[n, c]
        r = math.sqrt(ms / d + eps)
        rms[n] = r
        for c in range(d):
            xhat[n, c] = x[n, c] / r
            y[n, c] = xhat[n, c] * g[c]


def _rms_norm_rows_numpy(x, g, eps, y, xhat, rms):
    """:func:`_rms_norm_rows` over whole arrays."""
    rms[:] = np.sqrt((x * x).mean(axis=1) + x.dtype.type(eps))
    xhat[...] = x / rms[:, None]
    y[...] = xhat * g


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float):
    r"""``y = g x / sqrt(mean(x^2) + eps)`` over the last axis; returns ``(y, xhat, rms)``, the last two
    ``x / rms`` and ``rms`` (one per row)."""
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])           # (N, d)
    y, xhat, rms = np.empty_like(rows), np.empty_like(rows), np.empty(len(rows), dtype=rows.dtype)
    compiled_or(_rms_norm_rows, _rms_norm_rows_numpy, rows, g, eps, y, xhat, rms)
    return y.reshape(x.shape), xhat.reshape(x.shape), rms.reshape(x.shape[:-1])


def layer_norm_backward(dy: np.ndarray, cache: dict):
    r"""``(dx, dg, db)``: :math:`dx = r\,(\hat{dx} - \mathrm{mean}(\hat{dx}) - \hat x\,\mathrm{mean}(\hat{dx}\,\hat x))`
    with :math:`\hat{dx} = dy\,g` and :math:`r = 1/\sqrt{var + eps}`."""
    xhat, rstd, g = cache["xhat"], cache["rstd"], cache["g"]
    rows = np.ascontiguousarray(dy).reshape(xhat.shape)              # (N, d)
    dx, dg, db = np.empty_like(rows), np.empty_like(g), np.empty_like(g)
    compiled_or(_layer_norm_rows_backward, _layer_norm_rows_backward_numpy, rows, xhat, rstd, g, dx, dg, db)
    return dx.reshape(dy.shape), dg, db


# ----------------------------------------------------------------------------------------------
# the loss
# ----------------------------------------------------------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """Mean cross-entropy over every position, and its gradient ``(softmax - onehot) / N``.

    ``logits (..., V)``, ``targets (...)`` integer ids; returns ``(loss, d_logits)``.
    """
    V = logits.shape[-1]
    logp = log_softmax(logits).reshape(-1, V)                       # (N, V)
    t = targets.reshape(-1)
    N = t.size
    loss = -logp[np.arange(N), t].mean()
    d = np.exp(logp)
    d[np.arange(N), t] -= 1.0
    return loss, (d / N).reshape(logits.shape).astype(logits.dtype, copy=False)


# ----------------------------------------------------------------------------------------------
# GELU, tanh form (GPT-2's activation)
# ----------------------------------------------------------------------------------------------
GELU_TANH_C = math.sqrt(2.0 / math.pi)      # the one definition: the tuned twin (tuned/forward.py) reads it here


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    r""":math:`\mathrm{GELU}(x) \approx \tfrac12 x\,(1 + \tanh(\sqrt{2/\pi}\,(x + 0.044715\,x^3)))`, GPT-2's form.

    NumPy, not a compiled loop: its ``tanh`` runs on SIMD lanes, 4x faster than a scalar loop here.
    One buffer updated in place (GPT-2 small's hidden layer is 3072 wide: a temporary per operation
    cost a third of the time). The constants take ``x``'s dtype, so float32 stays float32.
    """
    c, a, one, half = (x.dtype.type(v) for v in (GELU_TANH_C, 0.044715, 1.0, 0.5))
    u = x * x
    u *= a
    u += one
    u *= x                          # x + 0.044715 x^3
    u *= c
    np.tanh(u, out=u)
    u += one
    u *= x
    u *= half
    return u


@njit(cache=True, nogil=True)
def _gelu_tanh_backward_flat(dy, x, dx):
    """``dx = dy * GELU'(x)``, with ``u = c (x + 0.044715 x^3)``:
    ``GELU'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2)``."""
    c = GELU_TANH_C
    for n in range(x.size):
        v = x[n]
        t = math.tanh(c * (v + 0.044715 * v * v * v))
        dx[n] = dy[n] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v))


def _gelu_tanh_backward_numpy(dy, x, dx):
    """:func:`_gelu_tanh_backward_flat` over whole arrays."""
    t = np.tanh(GELU_TANH_C * (x + 0.044715 * x ** 3))
    dx[:] = dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_TANH_C * (1.0 + 3.0 * 0.044715 * x * x))


def gelu_tanh_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The gradient through :func:`gelu_tanh` at its input ``x``."""
    dx = np.empty(x.size, dtype=x.dtype)
    compiled_or(_gelu_tanh_backward_flat, _gelu_tanh_backward_numpy, np.ascontiguousarray(dy).reshape(-1),
                np.ascontiguousarray(x).reshape(-1), dx)
    return dx.reshape(x.shape)


# ----------------------------------------------------------------------------------------------
# GELU, exact (BERT's activation)
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _gelu_erf_flat(x, y):
    """``y = 0.5 x (1 + erf(x / sqrt 2))``, one element at a time (NumPy has no erf)."""
    r = 1.0 / math.sqrt(2.0)
    for n in range(x.size):
        y[n] = 0.5 * x[n] * (1.0 + math.erf(x[n] * r))


@njit(cache=True, nogil=True, error_model="numpy")
def _gelu_erf_rational(x, y):
    """``y = 0.5 x (1 + erf(x / sqrt 2))`` in float32, erf from a rational fit good to 7e-8 that runs
    on SIMD lanes (:func:`core.kernels.tuned.fastexp.gelu_erf`, which our product's epilogue applies too).
    error_model="numpy": Python's check for a zero divisor would keep the loop scalar."""
    for n in range(x.size):
        y[n] = gelu_erf_f32(x[n])


_erf = np.frompyfunc(math.erf, 1, 1)          # NumPy has no erf: Python's, element by element


def _gelu_erf_numpy(x, y):
    """:func:`_gelu_erf_flat` through Python's ``math.erf`` (slow, and needs no compiler)."""
    y[:] = 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))).astype(x.dtype))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    r""":math:`\mathrm{GELU}(x) = x\,\Phi(x) = \tfrac12 x\,(1 + \mathrm{erf}(x/\sqrt2))`, the exact form BERT uses
    (the tanh form is an approximation of it). Float64 calls the exact erf; float32 a rational fit
    of it, good to 7e-8 (below float32's own rounding), that runs on SIMD lanes; a NaN stays NaN."""
    y = np.empty(x.size, dtype=x.dtype)
    kernel = _gelu_erf_flat if x.dtype == np.float64 else _gelu_erf_rational
    compiled_or(kernel, _gelu_erf_numpy, np.ascontiguousarray(x).reshape(-1), y)
    return y.reshape(x.shape)


@njit(cache=True, nogil=True)
def _gelu_erf_backward_flat(dy, x, dx):
    """``dx = dy * GELU'(x)``: the derivative of ``x Phi(x)`` is ``Phi(x) + x phi(x)``, with
    ``Phi(x) = 0.5 (1 + erf(x / sqrt 2))`` and ``phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``."""
    r, s = 1.0 / math.sqrt(2.0), 1.0 / math.sqrt(2.0 * math.pi)
    for n in range(x.size):
        v = x[n]
        dx[n] = dy[n] * (0.5 * (1.0 + math.erf(v * r)) + v * s * math.exp(-0.5 * v * v))


def _gelu_erf_backward_numpy(dy, x, dx):
    """:func:`_gelu_erf_backward_flat` through Python's ``math.erf`` (slow, and needs no compiler)."""
    Phi = 0.5 * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))).astype(x.dtype))
    phi = np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    dx[:] = dy * (Phi + x * phi)


def gelu_erf_backward(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""The gradient through :func:`gelu_erf` at its input ``x``:
    :math:`dx = dy\,(\Phi(x) + x\,\varphi(x))`, the normal distribution's CDF and density."""
    dx = np.empty(x.size, dtype=x.dtype)
    compiled_or(_gelu_erf_backward_flat, _gelu_erf_backward_numpy, np.ascontiguousarray(dy).reshape(-1),
                np.ascontiguousarray(x).reshape(-1), dx)
    return dx.reshape(x.shape)
