"""Tuned twins of the readable transformer's elementwise steps, for models of GPT-2's size.

:mod:`core.model.transformer` is what the pages show; at GPT-2's sizes (a weight matrix of at least
``BLAS_FROM`` numbers) it calls these instead, in one visible place each. They compute the same
numbers as the readable steps (to float32 rounding; tests hold them to it in float32 and float64),
and leave the same arrays in the cache:

- :func:`softmax_rows`: the attention rows' softmax in one compiled pass per row instead of five
  NumPy passes (max, subtract, exp, sum, divide) with a temporary each; float32 takes the
  vectorisable Cephes ``exp`` of the tuned attention kernels (:mod:`core.kernels.tuned.fastexp`);
- :func:`gelu_tanh`: GELU's tanh form in one pass, written as ``x sigmoid(2u)`` (below), instead of
  eight NumPy passes and NumPy's ``tanh``;
- :func:`silu`: SiLU (Llama's gate), ``x sigmoid(x)``, in one pass instead of six;
- :func:`rms_norm`: RMSNorm with its sum of squares in eight chains and one division a row; the
  readable loop waits on each addition in turn and divides every number;
- :func:`rotate`: rotary positions' turn of the queries and keys, in one pass instead of five
  NumPy passes and a concatenation;
- :func:`attention`: for a pass that keeps neither the scores nor the weights (``keep=``), each
  head's ``softmax(Q K^T / sqrt(d_k) + M) V`` through the fused kernel of the attention lessons
  (:func:`core.kernels.tuned.cpu.fused_attention`: an online softmax over tiles of keys, the masked
  tiles skipped), never writing the ``(Tq, Tk)`` weights;
- :func:`append_kv`: the KV cache in a buffer with room to grow, so that a new token's keys and
  values are written once instead of copying every earlier position's (``np.concatenate``).

Each kernel runs on the calling thread (``nogil``, no Numba threads): its work sits between BLAS
products, and two thread pools on a small machine take turns spinning (see the transformer's
docstring). No ``fastmath``: ``-inf`` lives in the masked scores.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from core import masks
from core.kernels.tuned.fastexp import EXP_MAX, fast_exp, gelu_tanh as fast_gelu_tanh, silu as fast_silu
from core.model.layers import GELU_TANH_C        # sqrt(2 / pi), defined once beside the readable GELU
from core.readiness import can_run

JIT = dict(cache=True, nogil=True, error_model="numpy")


def ready(dtype) -> bool:
    """Whether the compiled kernels below are loaded for ``dtype`` (:func:`core.readiness.can_run`):
    until they are, a freshly started server runs the readable steps."""
    one, t = np.zeros(1, dtype), np.dtype(dtype).type
    heads = np.zeros((1, 2, 2, 2), dtype)                  # queries or keys as split_heads gives them: strided
    angles = np.zeros((2, 2), dtype)                       # read-only, as positions.rotary_angles keeps them
    angles.setflags(write=False)
    return (can_run(_softmax_rows, one[None], one[None], t(0)) and can_run(_gelu_tanh_flat, one, one, *(t(0),) * 4)
            and can_run(_silu_flat, one, one, t(0), t(0)) and can_run(_rms_norm_rows, one[None], one, 0.0, *(one[None],) * 2, one)
            and can_run(_rotate, heads.swapaxes(1, 2), angles, angles, heads))


# ----------------------------------------------------------------------------------------------
# the attention rows' softmax
# ----------------------------------------------------------------------------------------------
@njit(**JIT)
def _softmax_rows(S, A, zero):
    """``A[r] = softmax(S[r])`` for every row of ``S (N, n)``; ``-inf`` gets exactly 0, and a row
    with nothing allowed all zeros. ``zero`` is 0 in the arrays' dtype (the sums stay in it).

    The row's maximum and sum run as eight interleaved chains (``j mod 8``), added up at the end:
    one chain waits on each addition's latency, eight keep the adder busy.
    """
    N, n = S.shape
    m = n - n % 8
    for r in range(N):
        t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = S[r, 0]        # in S's dtype: float32 stays float32
        for j in range(0, m, 8):
            t0, t1 = max(t0, S[r, j]), max(t1, S[r, j + 1])
            t2, t3 = max(t2, S[r, j + 2]), max(t3, S[r, j + 3])
            t4, t5 = max(t4, S[r, j + 4]), max(t5, S[r, j + 5])
            t6, t7 = max(t6, S[r, j + 6]), max(t7, S[r, j + 7])
        top = max(max(max(t0, t1), max(t2, t3)), max(max(t4, t5), max(t6, t7)))
        for j in range(m, n):
            top = max(top, S[r, j])
        if top == -np.inf:
            for j in range(n):
                A[r, j] = zero
            continue
        for j in range(n):                       # exp alone in its loop: it runs in SIMD lanes
            A[r, j] = fast_exp(S[r, j] - top)
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        for j in range(0, m, 8):
            s0, s1, s2, s3 = s0 + A[r, j], s1 + A[r, j + 1], s2 + A[r, j + 2], s3 + A[r, j + 3]
            s4, s5, s6, s7 = s4 + A[r, j + 4], s5 + A[r, j + 5], s6 + A[r, j + 6], s7 + A[r, j + 7]
        total = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
        for j in range(m, n):
            total += A[r, j]
        for j in range(n):
            A[r, j] = A[r, j] / total


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """:func:`core.model.multi_head.softmax_rows`, compiled: each row of ``S`` through softmax,
    in a new array; a ``-inf`` score gets exactly 0."""
    rows = np.ascontiguousarray(S).reshape(-1, S.shape[-1])                 # (N, Tk)
    A = np.empty_like(rows)
    _softmax_rows(rows, A, rows.dtype.type(0))
    return A.reshape(S.shape)


# ----------------------------------------------------------------------------------------------
# GELU, tanh form
# ----------------------------------------------------------------------------------------------
@njit(**JIT)
def _gelu_tanh_flat(x, y, c, a, one, top):
    """``y = x / (1 + exp(-2u))`` with ``u = c (x + a x^3)``: the same as ``0.5 x (1 + tanh u)``,
    since ``1 + tanh u = 2 / (1 + e^{-2u})``; ``-2u`` is held at or below ``top``."""
    for n in range(x.size):
        y[n] = fast_gelu_tanh(x[n], c, a, one, top)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    r""":func:`core.model.layers.gelu_tanh`, compiled:
    :math:`\tfrac12 x (1 + \tanh u) = x / (1 + e^{-2u})`, :math:`u = \sqrt{2/\pi}(x + 0.044715 x^3)`.

    The sigmoid form needs one ``exp`` and no ``1 + tanh`` (which loses the small values of a
    negative ``x`` to cancellation); in float32 that ``exp`` runs in SIMD lanes.
    """
    flat = np.ascontiguousarray(x).reshape(-1)
    y = np.empty_like(flat)
    t = flat.dtype.type
    _gelu_tanh_flat(flat, y, t(GELU_TANH_C), t(0.044715), t(1.0), t(EXP_MAX))
    return y.reshape(x.shape)


# ----------------------------------------------------------------------------------------------
# SiLU
# ----------------------------------------------------------------------------------------------
@njit(**JIT)
def _silu_flat(x, y, one, top):
    """``y = x / (1 + exp(-x))``, ``-x`` held at or below ``top`` (beyond it the output is 0 to the
    last bit either way)."""
    for n in range(x.size):
        y[n] = fast_silu(x[n], one, top)


def silu(x: np.ndarray) -> np.ndarray:
    """:func:`core.model.activations.silu`, compiled: ``x sigmoid(x) = x / (1 + e^{-x})`` in one
    pass, its ``exp`` in SIMD lanes in float32."""
    flat = np.ascontiguousarray(x).reshape(-1)
    y = np.empty_like(flat)
    t = flat.dtype.type
    _silu_flat(flat, y, t(1.0), t(EXP_MAX))
    return y.reshape(x.shape)


# ----------------------------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------------------------
@njit(**JIT)
def _rms_norm_rows(x, g, eps, y, xhat, rms):
    """:func:`core.model.layers._rms_norm_rows`: ``rms[n] = sqrt(mean(x[n]^2) + eps)``, ``xhat[n] = x[n] /
    rms[n]``, ``y[n] = xhat[n] g``, the squares summed (in float64, as there) in eight interleaved
    chains (``c mod 8``), and ``x[n]`` times ``1 / rms[n]`` in place of a division per number."""
    N, d = x.shape
    m = d - d % 8
    for n in range(N):
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        for c in range(0, m, 8):
            s0, s1 = s0 + x[n, c] * x[n, c], s1 + x[n, c + 1] * x[n, c + 1]
            s2, s3 = s2 + x[n, c + 2] * x[n, c + 2], s3 + x[n, c + 3] * x[n, c + 3]
            s4, s5 = s4 + x[n, c + 4] * x[n, c + 4], s5 + x[n, c + 5] * x[n, c + 5]
            s6, s7 = s6 + x[n, c + 6] * x[n, c + 6], s7 + x[n, c + 7] * x[n, c + 7]
        ms = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
        for c in range(m, d):
            ms += x[n, c] * x[n, c]
        r = math.sqrt(ms / d + eps)
        rms[n] = r
        inv = 1.0 / r
        for c in range(d):
            xhat[n, c] = x[n, c] * inv
            y[n, c] = xhat[n, c] * g[c]


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float):
    """:func:`core.model.layers.rms_norm`, compiled for speed: ``(y, xhat, rms)`` of ``y = g x / sqrt(mean(x^2)
    + eps)`` over the last axis."""
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])                 # (N, d)
    y, xhat, rms = np.empty_like(rows), np.empty_like(rows), np.empty(len(rows), dtype=rows.dtype)
    _rms_norm_rows(rows, g.copy(), float(eps), y, xhat, rms)      # a copy: a file's read-only gain is a type of its own
    return y.reshape(x.shape), xhat.reshape(x.shape), rms.reshape(x.shape[:-1])


# ----------------------------------------------------------------------------------------------
# rotary positions
# ----------------------------------------------------------------------------------------------
@njit(**JIT)
def _rotate(x, cos, sin, y):
    """``y = x cos + rotate_half(x) sin`` for ``x (B, H, T, d_k)`` (any strides): feature ``c`` of the
    first half takes ``x_c cos - x_{c + d_k/2} sin``, of the second ``x_c cos + x_{c - d_k/2} sin``."""
    B, H, T, d = x.shape
    half = d // 2
    for b in range(B):
        for h in range(H):
            for t in range(T):
                for c in range(half):
                    y[b, h, t, c] = x[b, h, t, c] * cos[t, c] - x[b, h, t, c + half] * sin[t, c]
                for c in range(half, d):
                    y[b, h, t, c] = x[b, h, t, c] * cos[t, c] + x[b, h, t, c - half] * sin[t, c]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """:func:`core.model.positions.rotate`, compiled: queries or keys ``x (B, H, T, d_k)`` turned by
    their positions' angles ``cos, sin (T, d_k)``, in a new array, in one pass."""
    y = np.empty(x.shape, dtype=np.result_type(x, cos))
    _rotate(x, cos, sin, y)
    return y


# ----------------------------------------------------------------------------------------------
# attention without its weights
# ----------------------------------------------------------------------------------------------
def attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, causal: bool, key_mask) -> np.ndarray | None:
    """Every query head's ``softmax(Q K^T / sqrt(d_k) + M) V``, ``(B, H, Tq, d_k)``, for ``Q (B, H, Tq,
    d_k)`` and ``K, V (B, H_kv, Tk, d_k)`` (``Tk - Tq`` positions already in a KV cache), ``M`` the causal
    mask if ``causal`` plus ``key_mask`` ``(B, 1, 1, Tk)`` (or None); None while the fused kernel is not
    loaded (the caller runs the readable steps). The ``H / H_kv`` query heads that share a key/value
    head are the rows of one problem, as in :func:`core.model.multi_head.grouped`."""
    from core.kernels.tuned import cpu as tuned_cpu   # the attention kernels: imported by a real model's pass (a lesson page never)

    B, H, Tq, d_k = Q.shape
    H_kv, Tk = K.shape[1], K.shape[2]
    group = H // H_kv
    mask = _mask(Tq, Tk - Tq, group, causal, Q.dtype.str)                       # (1, 1, group Tq, Tk) or (1, 1, 1, 1)
    if key_mask is not None:
        mask = np.ascontiguousarray(mask + key_mask)                            # (B, 1, group Tq or 1, Tk)
    Z = tuned_cpu.fused_attention_if_loaded(np.ascontiguousarray(Q).reshape(B, H_kv, group * Tq, d_k),
                                            np.ascontiguousarray(K), np.ascontiguousarray(V), mask,
                                            1.0 / math.sqrt(d_k))
    return None if Z is None else Z.reshape(B, H, Tq, V.shape[3])


@functools.lru_cache(maxsize=16)
def _mask(Tq: int, start: int, group: int, causal: bool, dtype: str) -> np.ndarray:
    """The additive mask of :func:`attention`: the causal mask (:func:`core.masks.causal`) once for each
    query head of a group, or one 0 that every score takes; kept for the next layer. Left writable
    (nothing writes it: it never leaves this module) so that the kernel has one signature, masked
    padding or not."""
    return np.tile(masks.causal(Tq, dtype, start=start), (group, 1))[None, None] if causal else np.zeros((1, 1, 1, 1), dtype)


# ----------------------------------------------------------------------------------------------
# the KV cache, in a buffer with room to grow
# ----------------------------------------------------------------------------------------------
MIN_ROOM = 64      # positions a fresh buffer holds at least


def append_kv(kv: dict, K: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This layer's keys and values so far, ``(B, H, start + T, d_k)`` each, after appending the
    new ``K, V (B, H, T, d_k)``; ``kv["K"]``, ``kv["V"]`` are set to them, as the readable
    ``np.concatenate`` does.

    They are views of a buffer (``kv["buffer"]``) with room for more positions: the next token's
    keys and values go into the room, and only a full buffer is copied, into one twice its size.
    A dict copied from another (two continuations of one prompt) shares the buffer: it writes
    into it only while it holds every position the buffer has filled (``fill``), else it first
    copies its own positions into a buffer of its own, so that neither overwrites the other's.
    """
    n, T = (kv["K"].shape[2] if "K" in kv else 0), K.shape[2]
    buf = kv.get("buffer")
    if buf is None or buf["fill"][0] != n or n + T > buf["K"].shape[2] or buf["K"].shape[:2] != K.shape[:2] \
            or buf["K"].shape[3] != K.shape[3] or buf["K"].dtype != K.dtype:
        room = max(MIN_ROOM, 2 * (n + T))
        shape = (K.shape[0], K.shape[1], room, K.shape[3])
        buf = {"K": np.empty(shape, dtype=K.dtype), "V": np.empty(shape, dtype=V.dtype), "fill": [n]}
        if n:
            buf["K"][:, :, :n] = kv["K"]
            buf["V"][:, :, :n] = kv["V"]
        kv["buffer"] = buf
    buf["K"][:, :, n:n + T] = K
    buf["V"][:, :, n:n + T] = V
    buf["fill"][0] = n + T
    kv["K"], kv["V"] = buf["K"][:, :, :n + T], buf["V"][:, :, :n + T]
    return kv["K"], kv["V"]
