"""Numba kernels for the tiny encoder: the fused pieces between its matrix products.

The encoder is small (batch 64, T 16, d_model 32), so one NumPy call per elementwise step would
spend more time in Python than in arithmetic. Each kernel here fuses everything that lies between
two matrix products, forward or backward; the products themselves stay with NumPy's BLAS (``@``),
called from ``core/encoder.py``.

Layout: activations are flattened to ``(N, d)`` rows with ``N = B * T`` (row ``b * T + t``);
attention weights are ``(B, H, T, T)``. Every kernel writes into arrays the caller passes, so the
training loop allocates nothing it does not have to. No ``fastmath``: the softmax relies on
``-inf``/``exp`` behaving exactly. No ``parallel``: at these sizes threads cost more than they save.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


# ----------------------------------------------------------------------------------------------
# 0. embedding
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def embed_forward(tokens, embed, pos, out):
    """``out[b*T + t] = embed[tokens[b, t]] + pos[t]``; ``pos`` is (T, d) (zeros when unused)."""
    B, T = tokens.shape
    d = embed.shape[1]
    for b in range(B):
        for t in range(T):
            row = b * T + t
            tok = tokens[b, t]
            for j in range(d):
                out[row, j] = embed[tok, j] + pos[t, j]


@njit(cache=True)
def embed_backward(tokens, dh, d_embed, d_pos):
    """Scatter-add ``dh`` rows into ``d_embed`` (by token) and ``d_pos`` (by position); overwrites both."""
    B, T = tokens.shape
    d = d_embed.shape[1]
    d_embed[:, :] = 0.0
    d_pos[:, :] = 0.0
    for b in range(B):
        for t in range(T):
            row = b * T + t
            tok = tokens[b, t]
            for j in range(d):
                d_embed[tok, j] += dh[row, j]
                d_pos[t, j] += dh[row, j]


# ----------------------------------------------------------------------------------------------
# 1. multi-head attention core (between the packed QKV projection and W_O)
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def attention_forward(qkv, b_q, b_k, b_v, B, T, H, ctx, P):
    """Per-head scaled dot-product attention on a packed ``qkv = X [W_Q | W_K | W_V]`` of (N, 3d).

    Adds the biases into ``qkv`` in place (the backward pass needs Q, K, V with biases), then for
    every batch row and head ``P = softmax(Q_h K_h^T / sqrt(d_k))`` (stored in ``P`` (B, H, T, T))
    and ``ctx[:, head h columns] = P V_h`` (the concatenated head outputs, (N, d)).
    """
    N = qkv.shape[0]
    d = qkv.shape[1] // 3
    dk = d // H
    scale = 1.0 / math.sqrt(dk)
    for n in range(N):
        for j in range(d):
            qkv[n, j] += b_q[j]
            qkv[n, d + j] += b_k[j]
            qkv[n, 2 * d + j] += b_v[j]
    s = np.empty(T, dtype=np.float64)
    for b in range(B):
        base = b * T
        for h in range(H):
            off = h * dk
            for i in range(T):
                qi = base + i
                # scores of query i against every key, and their max for a stable softmax
                m = -np.inf
                for j in range(T):
                    kj = base + j
                    acc = 0.0
                    for c in range(dk):
                        acc += qkv[qi, off + c] * qkv[kj, d + off + c]
                    acc *= scale
                    s[j] = acc
                    if acc > m:
                        m = acc
                total = 0.0
                for j in range(T):
                    e = math.exp(s[j] - m)
                    s[j] = e
                    total += e
                for c in range(dk):
                    ctx[qi, off + c] = 0.0
                for j in range(T):
                    p = s[j] / total
                    P[b, h, i, j] = p
                    kj = base + j
                    for c in range(dk):
                        ctx[qi, off + c] += p * qkv[kj, 2 * d + off + c]


@njit(cache=True)
def attention_backward(qkv, P, dctx, B, T, H, dqkv, db_qkv):
    """Backward of :func:`attention_forward`: ``dqkv`` (N, 3d) and the bias gradients ``db_qkv`` (3d,).

    With ``S = Q K^T / sqrt(d_k)``, ``P = softmax(S)``, ``O = P V``:
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``,
    ``dQ = dS K / sqrt(d_k)``, ``dK = dS^T Q / sqrt(d_k)``. Overwrites both outputs.
    """
    N = qkv.shape[0]
    d = qkv.shape[1] // 3
    dk = d // H
    scale = 1.0 / math.sqrt(dk)
    dqkv[:, :] = 0.0
    dp = np.empty(T, dtype=np.float64)
    for b in range(B):
        base = b * T
        for h in range(H):
            off = h * dk
            for i in range(T):
                qi = base + i
                rowdot = 0.0
                for j in range(T):
                    kj = base + j
                    p = P[b, h, i, j]
                    acc = 0.0
                    for c in range(dk):
                        g = dctx[qi, off + c]
                        acc += g * qkv[kj, 2 * d + off + c]
                        dqkv[kj, 2 * d + off + c] += p * g          # dV
                    dp[j] = acc
                    rowdot += p * acc
                for j in range(T):
                    kj = base + j
                    ds = P[b, h, i, j] * (dp[j] - rowdot) * scale
                    for c in range(dk):
                        dqkv[qi, off + c] += ds * qkv[kj, d + off + c]      # dQ
                        dqkv[kj, d + off + c] += ds * qkv[qi, off + c]      # dK
    column_sums(dqkv, db_qkv)


# ----------------------------------------------------------------------------------------------
# 2. residual + layer norm, feed-forward activation
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def residual_layernorm_forward(x, r, bias, gain, shift, eps, y, xhat, rstd):
    """``y = LN(x + r + bias)`` row by row: ``xhat = (v - mean) / sqrt(var + eps)``, ``y = gain * xhat + shift``.

    Keeps ``xhat`` (N, d) and ``rstd`` (N,) for the backward pass. ``var`` is the biased variance.
    """
    N, d = x.shape
    for n in range(N):
        mean = 0.0
        for j in range(d):
            v = x[n, j] + r[n, j] + bias[j]
            xhat[n, j] = v
            mean += v
        mean /= d
        var = 0.0
        for j in range(d):
            c = xhat[n, j] - mean
            var += c * c
        var /= d
        rs = 1.0 / math.sqrt(var + eps)
        rstd[n] = rs
        for j in range(d):
            xh = (xhat[n, j] - mean) * rs
            xhat[n, j] = xh
            y[n, j] = gain[j] * xh + shift[j]


@njit(cache=True)
def layernorm_backward(dy, xhat, rstd, gain, dx, dgain, dshift):
    """Backward of the layer norm: ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * gain``.

    Overwrites ``dx`` (N, d), ``dgain`` and ``dshift`` (d,).
    """
    N, d = dy.shape
    dgain[:] = 0.0
    dshift[:] = 0.0
    for n in range(N):
        s1 = 0.0
        s2 = 0.0
        for j in range(d):
            g = dy[n, j] * gain[j]
            s1 += g
            s2 += g * xhat[n, j]
            dgain[j] += dy[n, j] * xhat[n, j]
            dshift[j] += dy[n, j]
        s1 /= d
        s2 /= d
        rs = rstd[n]
        for j in range(d):
            dx[n, j] = rs * (dy[n, j] * gain[j] - s1 - xhat[n, j] * s2)


@njit(cache=True)
def bias_relu_forward(z, bias):
    """In place: ``z = max(z + bias, 0)``."""
    N, m = z.shape
    for n in range(N):
        for j in range(m):
            v = z[n, j] + bias[j]
            z[n, j] = v if v > 0.0 else 0.0


@njit(cache=True)
def relu_backward(da, a, dbias):
    """In place: ``da = da * (a > 0)`` (``a`` is the ReLU output); ``dbias`` = its column sums."""
    N, m = da.shape
    dbias[:] = 0.0
    for n in range(N):
        for j in range(m):
            if a[n, j] <= 0.0:
                da[n, j] = 0.0
            dbias[j] += da[n, j]


@njit(cache=True)
def column_sums(x, out):
    """``out = x.sum(axis=0)`` (overwrites ``out``)."""
    N, m = x.shape
    out[:] = 0.0
    for n in range(N):
        for j in range(m):
            out[j] += x[n, j]


# ----------------------------------------------------------------------------------------------
# 3. pooling and the loss
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def mean_pool(h, B, T, out):
    """``out[b] = mean_t h[b*T + t]`` (overwrites ``out`` (B, d))."""
    d = h.shape[1]
    out[:, :] = 0.0
    for b in range(B):
        for t in range(T):
            for j in range(d):
                out[b, j] += h[b * T + t, j]
        for j in range(d):
            out[b, j] /= T


@njit(cache=True)
def mean_pool_backward(dpooled, T, dh):
    """Each position receives ``dpooled[b] / T`` (overwrites ``dh`` (B*T, d))."""
    B, d = dpooled.shape
    for b in range(B):
        for t in range(T):
            for j in range(d):
                dh[b * T + t, j] = dpooled[b, j] / T


@njit(cache=True)
def softmax_cross_entropy(logits, labels, dlogits):
    """Mean cross-entropy ``-log softmax(z)[y]`` over the batch; ``dlogits = (softmax(z) - onehot(y)) / B``.

    Returns ``(loss, n_correct)``; ties in the arg-max go to the lower class index.
    """
    B, C = logits.shape
    loss = 0.0
    correct = 0
    for b in range(B):
        m = -np.inf
        best = 0
        for c in range(C):
            if logits[b, c] > m:
                m = logits[b, c]
                best = c
        total = 0.0
        for c in range(C):
            total += math.exp(logits[b, c] - m)
        y = labels[b]
        loss += math.log(total) + m - logits[b, y]
        if best == y:
            correct += 1
        for c in range(C):
            p = math.exp(logits[b, c] - m) / total
            dlogits[b, c] = (p - (1.0 if c == y else 0.0)) / B
    return loss / B, correct


# ----------------------------------------------------------------------------------------------
# 4. optimiser
# ----------------------------------------------------------------------------------------------
@njit(cache=True)
def adam_update(p, g, m, v, lr, beta1, beta2, eps, step):
    """One Adam step on flat arrays, in place, with bias correction (``step`` counts from 1).

    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    """
    c1 = 1.0 - beta1 ** step
    c2 = 1.0 - beta2 ** step
    for i in range(p.shape[0]):
        gi = g[i]
        mi = beta1 * m[i] + (1.0 - beta1) * gi
        vi = beta2 * v[i] + (1.0 - beta2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= lr * (mi / c1) / (math.sqrt(vi / c2) + eps)
