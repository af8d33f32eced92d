"""The two ends of the compiled models: token embedding in; mean pooling, classifier and
cross-entropy out."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core.kernels.tuned import simd
from core.model.tuned import JIT


@njit(**JIT)
def column(b, t, T, L):
    """The column of position ``t`` of sequence ``b`` in a chunk's activations: sequences are
    grouped by vectors of ``L`` (their lanes), each group holding its ``T x L`` columns
    position-major: ``((b // L) T + t) L + b % L``."""
    return ((b // L) * T + t) * L + b % L


@njit(**JIT)
def embed_forward(tokens, embed, pe, X):
    """``X[:, column(b, t)] = embed[tokens[b, t]] + pe[t]``: ``X`` (d, N), ``pe`` (T, d).

    One row of ``X`` (one feature) at a time, its columns in order: writes along the row, where
    a column at a time wrote one number per cache line."""
    Bp, T = tokens.shape
    d = embed.shape[1]
    L = simd.lanes_of(X)
    for c in range(d):
        for v in range(Bp // L):
            for t in range(T):
                n0, p = (v * T + t) * L, pe[t, c]
                for lane in range(L):
                    X[c, n0 + lane] = embed[tokens[v * L + lane, t], c] + p


@njit(**JIT)
def embed_backward(tokens, dX, d_embed, d_pos):
    """Scatter-add the columns of ``dX`` (d, N) into ``d_embed`` (V, d) by token and ``d_pos``
    (at least T, d) by position; both are zeroed first. Each entry adds its columns in sequence
    order, then position order, whatever the loop order; one feature (a row of ``dX``) at a time
    reads the rows in order."""
    Bp, T = tokens.shape
    d = dX.shape[0]
    L = simd.lanes_of(dX)
    for v in range(d_embed.shape[0]):
        for c in range(d):
            d_embed[v, c] = 0.0
    for t in range(d_pos.shape[0]):
        for c in range(d):
            d_pos[t, c] = 0.0
    for c in range(d):
        for b in range(Bp):
            for t in range(T):
                g = dX[c, column(b, t, T, L)]
                d_embed[tokens[b, t], c] += g
                d_pos[t, c] += g


@njit(**JIT)
def mean_pool(X, T, pooled):
    """``pooled[:, b] = mean_t X[:, column(b, t)]``: ``X`` (d, N), ``pooled`` (d, Bp). A vector of
    sequences at a time, each lane adding its positions in order."""
    d, Bp = pooled.shape
    L = simd.lanes_of(X)
    x, out = X.ravel(), pooled.ravel()
    N = X.shape[1]
    for c in range(d):
        for v in range(Bp // L):
            at = c * N + v * T * L
            total = simd.load(x, at)
            for t in range(1, T):
                total = simd.add(total, simd.load(x, at + t * L))
            simd.store(out, c * Bp + v * L, total)
        for b in range(Bp):
            pooled[c, b] /= T


@njit(**JIT)
def classify(pooled, W, bias, logits):
    """``logits = pooled^T W + bias``: ``pooled`` (d, Bp), ``W`` (d, C), ``logits`` (Bp, C)."""
    d, Bp = pooled.shape
    C = W.shape[1]
    for b in range(Bp):
        for k in range(C):
            total = bias[k]
            for c in range(d):
                total += pooled[c, b] * W[c, k]
            logits[b, k] = total


@njit(**JIT)
def cross_entropy(logits, labels, scale, dlogits):
    """Summed cross-entropy ``sum_b -log softmax(z_b)[y_b]`` (in float64) over the ``len(labels)``
    first rows of ``logits`` and the number of arg-max hits (ties go to the lower class);
    ``dlogits = (softmax(z) - onehot(y)) * scale`` there, 0 in the rows after (padding)."""
    C = logits.shape[1]
    loss = 0.0
    correct = 0
    for b in range(dlogits.shape[0]):
        for k in range(C):
            dlogits[b, k] = 0.0
    for b in range(labels.shape[0]):
        top, best = logits[b, 0], 0
        for k in range(1, C):
            if logits[b, k] > top:
                top, best = logits[b, k], k
        total = 0.0
        for k in range(C):
            total += math.exp(logits[b, k] - top)
        y = labels[b]
        loss += math.log(total) + top - logits[b, y]
        correct += best == y
        for k in range(C):
            p = math.exp(logits[b, k] - top) / total
            dlogits[b, k] = (p - (1.0 if k == y else 0.0)) * scale
    return loss, correct


@njit(**JIT)
def classify_backward(pooled, W, dlogits, T, dW, dbias, dX):
    """Backward of :func:`classify` and :func:`mean_pool`: ``dW``, ``dbias`` overwritten, and
    every position of sequence b gets ``dpooled_b / T`` in ``dX`` (d, N), at :func:`column`."""
    d, Bp = pooled.shape
    C = W.shape[1]
    L = simd.lanes_of(dX)
    gb = np.empty(Bp, dX.dtype)                     # one feature's dpooled / T, per sequence
    for k in range(C):
        total = dlogits[0, k]
        for b in range(1, Bp):
            total += dlogits[b, k]
        dbias[k] = total
    for c in range(d):
        for k in range(C):
            total = pooled[c, 0] * dlogits[0, k]
            for b in range(1, Bp):
                total += pooled[c, b] * dlogits[b, k]
            dW[c, k] = total
        for b in range(Bp):
            g = dlogits[b, 0] * W[c, 0]
            for k in range(1, C):
                g += dlogits[b, k] * W[c, k]
            g /= T
            gb[b] = g
        for v in range(Bp // L):                    # along the row: sequences v L .. v L + L - 1
            for t in range(T):
                n0 = (v * T + t) * L
                for lane in range(L):
                    dX[c, n0 + lane] = gb[v * L + lane]
