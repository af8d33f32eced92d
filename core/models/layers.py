"""The sublayers of a post-norm transformer, each as a forward and a hand-written backward pass.

Plain NumPy, written like the formulas. Every forward returns ``(output, cache)``; the matching
backward takes the gradient of the output and that cache, and returns the gradients of the
inputs and of the parameters. Shapes: activations ``(B, T, d)``, attention weights
``(B, H, Tq, Tk)``; weights are ``(d_in, d_out)`` applied as ``X @ W``.

The cache of an attention sublayer uses the project's vocabulary for what a forward pass leaves
behind: ``scores``, ``weights``, ``head_outputs``, ``concat``, ``output``.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from core import positional

ATTENTION_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


# ----------------------------------------------------------------------------------------------
# matrix products
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _matmul_batches(A, B, C):
    """``C[n] = A[n] B[n]`` for each n: A (N, r, k), B (N, k, c) -> C (N, r, c)."""
    for n in range(A.shape[0]):
        for i in range(A.shape[1]):
            C[n, i, :] = 0
            for p in range(A.shape[2]):
                a = A[n, i, p]
                for j in range(B.shape[2]):          # contiguous: LLVM gives it SIMD lanes
                    C[n, i, j] += a * B[n, p, j]


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for ``(..., r, k) @ (..., k, c)`` with the same leading axes (or ``b`` 2-D).

    Our own loop, not NumPy's BLAS: OpenBLAS has one thread count for the whole process, and its
    threads contend on a shared server; a serial compiled loop gives the same bits whatever else the
    process is doing, and at these sizes (512 x 32 by 32 x 96) it is as fast.
    """
    lead = a.shape[:-2]
    if b.ndim == 2:
        b = np.broadcast_to(b, lead + b.shape)
    A = np.ascontiguousarray(a).reshape(-1, a.shape[-2], a.shape[-1])     # (N, r, k)
    B = np.ascontiguousarray(b).reshape(-1, b.shape[-2], b.shape[-1])     # (N, k, c)
    C = np.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=np.result_type(a, b))
    _matmul_batches(A, B, C)
    return C.reshape(lead + C.shape[1:])


# ----------------------------------------------------------------------------------------------
# initial parameters
# ----------------------------------------------------------------------------------------------
def init_by_name(shapes: dict, seed: int, dtype) -> dict[str, np.ndarray]:
    """Fresh parameters for ``{name: shape}``, deterministic for a seed, chosen by each name's last
    part: weights (``W_...``, ``cross_W_...``) ``N(0, 1/d_in)``, embeddings ``N(0, 1)``, learned
    positions ``N(0, 0.1^2)``, layer-norm gains (``..._g``) 1, everything else (biases, shifts) 0."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype}.")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        short = name.rsplit(".", 1)[-1]
        if short == "embed":
            value = rng.standard_normal(shape)
        elif short == "pos":
            value = 0.1 * rng.standard_normal(shape)
        elif short.startswith(("W_", "cross_W_")):
            value = rng.standard_normal(shape) / math.sqrt(shape[0])
        elif short.endswith("_g"):
            value = np.ones(shape)
        else:
            value = np.zeros(shape)
        params[name] = np.ascontiguousarray(value, dtype=dtype)
    return params


@functools.lru_cache(maxsize=64)
def sinusoid_table(T: int, d: int, dtype_str: str) -> np.ndarray:
    """``PE (T, d)`` from our CPU kernels, computed in float64 and rounded once to the parameters'
    dtype; cached and read-only, as every forward pass of a given length adds the same table."""
    table = positional.sinusoidal(T, d, backend="cpu", dtype=np.float64).astype(np.dtype(dtype_str))
    table.setflags(write=False)
    return table


# ----------------------------------------------------------------------------------------------
# heads: pure reshapes
# ----------------------------------------------------------------------------------------------
def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """``(B, T, H*d_k) -> (B, H, T, d_k)``; head ``h`` takes columns ``h*d_k:(h+1)*d_k``."""
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, H, T, d_k) -> (B, T, H*d_k)``, the inverse of :func:`split_heads`."""
    B, H, T, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * dk)


def linear(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x @ W + b`` over the last axis of ``(..., d_in)``, as one matrix product over all rows."""
    y = matmul(x.reshape(-1, x.shape[-1]), W) + b                         # (N, d_out)
    return y.reshape(*x.shape[:-1], W.shape[1])


def linear_backward(dy: np.ndarray, x: np.ndarray, W: np.ndarray):
    """Gradients of ``y = x W + b``: ``(dx, dW, db)``; leading axes of ``x`` are summed for dW, db."""
    x2 = x.reshape(-1, x.shape[-1])                                 # (N, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])                              # (N, d_out)
    dx = matmul(dy2, W.T).reshape(x.shape)
    return dx, matmul(x2.T, dy2), dy2.sum(axis=0)


# ----------------------------------------------------------------------------------------------
# softmax with additive masks
# ----------------------------------------------------------------------------------------------
def masked_softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; ``-inf`` entries get weight exactly 0, and a row with nothing
    allowed gets all-zero weights (never NaN)."""
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)         # an all -inf row: exp(-inf) = 0 everywhere
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def softmax_backward(dA: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Gradient of the scores from that of ``A = softmax(S)``: ``dS = A * (dA - sum_j dA_j A_j)``."""
    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))


# ----------------------------------------------------------------------------------------------
# multi-head attention (self or cross)
# ----------------------------------------------------------------------------------------------
def project_kv(x_kv: np.ndarray, p: dict, n_heads: int):
    """Keys and values of a sequence, split into heads: ``K, V`` each ``(B, H, Tk, d_k)``."""
    K = split_heads(linear(x_kv, p["W_K"], p["b_K"]), n_heads)
    V = split_heads(linear(x_kv, p["W_V"], p["b_V"]), n_heads)
    return K, V


def attend(x_q: np.ndarray, K: np.ndarray, V: np.ndarray, p: dict, n_heads: int, mask=None):
    r"""Multi-head attention of the queries of ``x_q`` over given keys and values.

    .. math:: Q = x_q W_Q + b_Q, \quad A_h = \mathrm{softmax}(Q_h K_h^\top / \sqrt{d_k} + M),
              \quad \mathrm{out} = \mathrm{Concat}_h(A_h V_h)\, W_O + b_O

    Parameters
    ----------
    x_q : (B, Tq, d)
    K, V : (B, H, Tk, d_k), from :func:`project_kv` (or a KV cache)
    p : dict with ``W_Q, W_O, b_Q, b_O`` (and ``W_K, W_V, b_K, b_V`` for the backward pass)
    mask : additive mask broadcastable to (B, H, Tq, Tk), or None

    Returns
    -------
    output : (B, Tq, d)
    cache : dict with ``scores`` and ``weights`` (B, H, Tq, Tk), ``head_outputs`` (B, H, Tq, d_k),
        ``concat`` (B, Tq, d), ``output``, and the inputs the backward pass needs.
    """
    d_k = K.shape[-1]
    # 1. queries, split into heads
    Q = split_heads(linear(x_q, p["W_Q"], p["b_Q"]), n_heads)       # (B, H, Tq, d_k)
    # 2. scaled scores, masked
    scores = matmul(Q, K.transpose(0, 1, 3, 2)) / math.sqrt(d_k)         # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores + mask
    # 3. weights: each row a distribution over the keys
    A = masked_softmax(scores)
    # 4. each head's weighted average of the values, then concatenated
    Z = matmul(A, V)                                                # (B, H, Tq, d_k)
    concat = merge_heads(Z)                                         # (B, Tq, H*d_k)
    # 5. output projection
    out = linear(concat, p["W_O"], p["b_O"])                        # (B, Tq, d)
    cache = {"x_q": x_q, "Q": Q, "K": K, "V": V, "scores": scores, "weights": A,
             "head_outputs": Z, "concat": concat, "output": out}
    return out, cache


def attention(x_q: np.ndarray, x_kv: np.ndarray, p: dict, n_heads: int, mask=None):
    """Multi-head attention of ``x_q`` over ``x_kv`` (the same array for self-attention);
    see :func:`attend` for the formula and the cache."""
    K, V = project_kv(x_kv, p, n_heads)
    out, cache = attend(x_q, K, V, p, n_heads, mask)
    cache["x_kv"] = x_kv
    return out, cache


def attention_backward(d_out: np.ndarray, cache: dict, p: dict):
    """Backward pass of :func:`attention`, step by step in reverse.

    Returns
    -------
    dx_q : (B, Tq, d)
    dx_kv : (B, Tk, d); for self-attention add it to ``dx_q``
    grads : dict of ``W_Q ... b_O``
    """
    n_heads = cache["Q"].shape[1]
    d_k = cache["Q"].shape[-1]
    A, Q, K, V = cache["weights"], cache["Q"], cache["K"], cache["V"]
    g = {}
    # 5. output projection
    d_concat, g["W_O"], g["b_O"] = linear_backward(d_out, cache["concat"], p["W_O"])
    # 4. back into heads; Z = A V
    dZ = split_heads(d_concat, n_heads)                             # (B, H, Tq, d_k)
    dA = matmul(dZ, V.transpose(0, 1, 3, 2))                           # (B, H, Tq, Tk)
    dV = matmul(A.transpose(0, 1, 3, 2), dZ)                           # (B, H, Tk, d_k)
    # 3. softmax (masked entries have A = 0, so they get no gradient)
    dS = softmax_backward(dA, A) / math.sqrt(d_k)
    # 2. scores = Q K^T / sqrt(d_k)
    dQ = matmul(dS, K)                                             # (B, H, Tq, d_k)
    dK = matmul(dS.transpose(0, 1, 3, 2), Q)                           # (B, H, Tk, d_k)
    # 1. projections
    dx_q, g["W_Q"], g["b_Q"] = linear_backward(merge_heads(dQ), cache["x_q"], p["W_Q"])
    dx_k, g["W_K"], g["b_K"] = linear_backward(merge_heads(dK), cache["x_kv"], p["W_K"])
    dx_v, g["W_V"], g["b_V"] = linear_backward(merge_heads(dV), cache["x_kv"], p["W_V"])
    return dx_q, dx_k + dx_v, g


# ----------------------------------------------------------------------------------------------
# layer norm and the position-wise feed-forward network
# ----------------------------------------------------------------------------------------------
def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float):
    r"""``y = g * (x - mu) / sqrt(var + eps) + b`` over the last axis; returns ``(y, cache)``."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    return xhat * g + b, {"xhat": xhat, "rstd": rstd, "g": g}


def layer_norm_backward(dy: np.ndarray, cache: dict):
    r"""``(dx, dg, db)``: :math:`dx = r\,(\hat{dx} - \mathrm{mean}(\hat{dx}) - \hat x\,\mathrm{mean}(\hat{dx}\,\hat x))`
    with :math:`\hat{dx} = dy\,g` and :math:`r = 1/\sqrt{var + eps}`."""
    xhat, rstd = cache["xhat"], cache["rstd"]
    dxhat = dy * cache["g"]
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    d = dy.shape[-1]
    return dx, (dy * xhat).reshape(-1, d).sum(axis=0), dy.reshape(-1, d).sum(axis=0)


def feed_forward(x: np.ndarray, p: dict):
    """``relu(x W_1 + b_1) W_2 + b_2``; returns ``(y, cache)``."""
    pre = linear(x, p["W_1"], p["b_1"])                             # (B, T, d_ff)
    hidden = np.maximum(pre, 0.0)
    return linear(hidden, p["W_2"], p["b_2"]), {"x": x, "pre": pre, "hidden": hidden}


def feed_forward_backward(dy: np.ndarray, cache: dict, p: dict):
    """``(dx, grads)`` of :func:`feed_forward`, grads holding ``W_1, b_1, W_2, b_2``."""
    g = {}
    d_hidden, g["W_2"], g["b_2"] = linear_backward(dy, cache["hidden"], p["W_2"])
    d_pre = d_hidden * (cache["pre"] > 0)                           # relu passes where it was positive
    dx, g["W_1"], g["b_1"] = linear_backward(d_pre, cache["x"], p["W_1"])
    return dx, g


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
