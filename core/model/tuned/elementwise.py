"""Elementwise steps of the compiled models over ``(features, N)`` rows (one row per feature, one
column per token, so every loop over tokens runs along a contiguous row), and Adam on the flat
parameter buffer."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core.model.tuned import JIT, JIT_REDUCE


@njit(**JIT)
def add_bias(Y, bias):
    """In place: ``Y[m] += bias[m]``."""
    M, N = Y.shape
    for m in range(M):
        b = bias[m]
        for n in range(N):
            Y[m, n] += b


@njit(**JIT_REDUCE)
def row_sums(Y, out):
    """``out[m] = sum_n Y[m, n]`` (a bias's gradient)."""
    M, N = Y.shape
    for m in range(M):
        total = Y[m, 0]
        for n in range(1, N):
            total += Y[m, n]
        out[m] = total


@njit(**JIT)
def bias_relu(Z, bias):
    """In place: ``Z = max(Z + bias, 0)``, row ``m`` getting ``bias[m]``."""
    M, N = Z.shape
    zero = Z.dtype.type(0)
    for m in range(M):
        b = bias[m]
        for n in range(N):
            v = Z[m, n] + b
            Z[m, n] = v if v > zero else zero


@njit(**JIT_REDUCE)
def relu_backward(dA, A, dbias):
    """In place: ``dA = dA * (A > 0)`` (``A`` is the ReLU's output); ``dbias`` gets its row sums."""
    M, N = dA.shape
    zero = dA.dtype.type(0)
    for m in range(M):
        total = zero
        for n in range(N):
            g = dA[m, n] if A[m, n] > zero else zero
            dA[m, n] = g
            total += g
        dbias[m] = total


@njit(**JIT)
def residual_layernorm(X, R, bias, gain, shift, eps, Y, Xhat, rstd):
    """``Y = LN(X + R + bias)`` for every token (column): ``xhat = (v - mean) / sqrt(var + eps)``,
    ``y = gain * xhat + shift``, mean and (biased) variance over the features (rows).

    Keeps ``Xhat`` (d, N) and ``rstd`` (N,) for the backward pass.
    """
    d, N = X.shape
    inv_d = X.dtype.type(1.0 / d)
    mean = np.zeros(N, X.dtype)
    var = np.zeros(N, X.dtype)
    for c in range(d):
        for n in range(N):
            v = X[c, n] + R[c, n] + bias[c]
            Xhat[c, n] = v
            mean[n] += v
    for n in range(N):
        mean[n] *= inv_d
    for c in range(d):
        for n in range(N):
            diff = Xhat[c, n] - mean[n]
            var[n] += diff * diff
    for n in range(N):
        rstd[n] = 1.0 / math.sqrt(var[n] * inv_d + eps)
    for c in range(d):
        g, s = gain[c], shift[c]
        for n in range(N):
            xh = (Xhat[c, n] - mean[n]) * rstd[n]
            Xhat[c, n] = xh
            Y[c, n] = g * xh + s


@njit(**JIT_REDUCE)
def layernorm_backward(dY, Xhat, rstd, gain, dX, dgain, dshift):
    """Backward of the layer norm, per token: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``
    with ``g = dy * gain``; ``dgain = sum_n dy * xhat``, ``dshift = sum_n dy``. Overwrites the outputs."""
    d, N = dY.shape
    inv_d = dY.dtype.type(1.0 / d)
    s1 = np.zeros(N, dY.dtype)
    s2 = np.zeros(N, dY.dtype)
    for c in range(d):
        gc = gain[c]
        dg = ds = dY.dtype.type(0)
        for n in range(N):
            dy, xh = dY[c, n], Xhat[c, n]
            g = dy * gc
            s1[n] += g
            s2[n] += g * xh
            dg += dy * xh
            ds += dy
        dgain[c] = dg
        dshift[c] = ds
    for n in range(N):
        s1[n] *= inv_d
        s2[n] *= inv_d
    for c in range(d):
        gc = gain[c]
        for n in range(N):
            dX[c, n] = rstd[n] * (dY[c, n] * gc - s1[n] - Xhat[c, n] * s2[n])


@njit(**JIT)
def adam_update(p, g, m, v, lr, beta1, beta2, eps, step):
    """One Adam step on flat arrays, in place, with bias correction (``step`` counts from 1).

    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``, in the arrays' dtype (so float32
    runs in SIMD lanes).
    """
    f = p.dtype.type
    b1, b2, one_b1, one_b2 = f(beta1), f(beta2), f(1.0 - beta1), f(1.0 - beta2)
    step_size = f(lr / (1.0 - beta1 ** step))         # lr / (1 - b1^t)
    v_scale = f(1.0 / (1.0 - beta2 ** step))           # 1 / (1 - b2^t)
    tiny = f(eps)
    for i in range(p.shape[0]):
        gi = g[i]
        mi = b1 * m[i] + one_b1 * gi
        vi = b2 * v[i] + one_b2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= step_size * mi / (math.sqrt(vi * v_scale) + tiny)
