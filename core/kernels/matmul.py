"""The readable matrix product, ``out = act(X W + b)``: the lesson twin of :mod:`core.kernels.tuned.gemm`.

The loops of the definition, one output number at a time, summed in the order the tuned product
sums (``k = 0, 1, ...``). Tests hold the two to each other and to NumPy; the "Make it fast" page
starts from these loops on its way to the tuned product.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

ACTIVATIONS = ("none", "gelu_tanh", "silu", "gelu_erf")        # the codes 0, 1, 2, 3 of ``activation``


@njit(cache=True)
def matmul_kernel(X, W, bias, activation, out):
    """``out[i, j] = act(sum_k X[i, k] W[k, j] + b[j])``: row i of ``X`` against column j of ``W``.

    X (M, K), W (K, N), bias (N,) -> out (M, N); ``activation`` 0: none, 1: GELU (tanh form),
    2: SiLU, 3: GELU (exact, with erf).
    """
    M, K = X.shape
    N = W.shape[1]
    for i in range(M):
        for j in range(N):
            total = 0.0
            for k in range(K):
                total += X[i, k] * W[k, j]
            total += bias[j]
            if activation == 1:
                total = 0.5 * total * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (total + 0.044715 * total ** 3)))
            elif activation == 2:
                total = total / (1.0 + np.exp(-total))
            elif activation == 3:
                total = 0.5 * total * (1.0 + math.erf(total / math.sqrt(2.0)))
            out[i, j] = total
