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
def _gather_head(qkv, base, T, col, out):
    """Copy rows ``base..base+T`` of columns ``col..col+d_k`` into a contiguous (T, d_k) block."""
    dk = out.shape[1]
    for t in range(T):
        for c in range(dk):
            out[t, c] = qkv[base + t, col + c]


@njit(cache=True)
def _gather_head_transposed(qkv, base, T, col, out):
    """Like :func:`_gather_head` but transposed: ``out`` is (d_k, T)."""
    dk = out.shape[0]
    for t in range(T):
        for c in range(dk):
            out[c, t] = qkv[base + t, col + c]


@njit(cache=True)
def _matmul_nt_into(A, Bt, out, scale):
    """``out = scale * A @ Bt`` for small blocks, ordered so the innermost loop runs over ``out``'s
    columns (independent sums that vectorise) rather than along one long dependency chain."""
    n, k = A.shape
    m = Bt.shape[1]
    for i in range(n):
        for j in range(m):
            out[i, j] = 0.0
        for c in range(k):
            a = A[i, c] * scale
            for j in range(m):
                out[i, j] += a * Bt[c, j]


@njit(cache=True)
def attention_forward(qkv, b_q, b_k, b_v, B, T, H, ctx, P):
    """Per-head scaled dot-product attention on a packed ``qkv = X [W_Q | W_K | W_V]`` of (N, 3d).

    Adds the biases into ``qkv`` in place (the backward pass needs Q, K, V with biases), then for
    every batch row and head ``P = softmax(Q_h K_h^T / sqrt(d_k))`` (stored in ``P`` (B, H, T, T))
    and ``ctx[:, head h columns] = P V_h`` (the concatenated head outputs, (N, d)).
    Each head's Q, K, V are first copied into small contiguous blocks so the inner loops vectorise.
    """
    N = qkv.shape[0]
    d = qkv.shape[1] // 3
    dk = d // H
    scale = qkv.dtype.type(1.0 / math.sqrt(dk))
    for n in range(N):
        for j in range(d):
            qkv[n, j] += b_q[j]
            qkv[n, d + j] += b_k[j]
            qkv[n, 2 * d + j] += b_v[j]
    Qh = np.empty((T, dk), dtype=qkv.dtype)
    Kt = np.empty((dk, T), dtype=qkv.dtype)
    Vh = np.empty((T, dk), dtype=qkv.dtype)
    S = np.empty((T, T), dtype=qkv.dtype)
    for b in range(B):
        base = b * T
        for h in range(H):
            off = h * dk
            _gather_head(qkv, base, T, off, Qh)
            _gather_head_transposed(qkv, base, T, d + off, Kt)
            _gather_head(qkv, base, T, 2 * d + off, Vh)
            _matmul_nt_into(Qh, Kt, S, scale)                       # (T, T) scaled scores
            for i in range(T):
                m = S[i, 0]                                          # row max: a stable softmax
                for j in range(1, T):
                    if S[i, j] > m:
                        m = S[i, j]
                total = S[i, 0] * 0
                for j in range(T):
                    e = math.exp(S[i, j] - m)
                    S[i, j] = e
                    total += e
                inv = 1 / total
                for j in range(T):
                    P[b, h, i, j] = S[i, j] * inv
            for i in range(T):
                for c in range(dk):
                    ctx[base + i, off + c] = 0.0
                for j in range(T):
                    p = P[b, h, i, j]
                    for c in range(dk):
                        ctx[base + i, off + c] += p * Vh[j, c]


@njit(cache=True)
def attention_backward(qkv, P, dctx, B, T, H, dqkv, db_qkv):
    """Backward of :func:`attention_forward`: ``dqkv`` (N, 3d) and the bias gradients ``db_qkv`` (3d,).

    With ``S = Q K^T / sqrt(d_k)``, ``P = softmax(S)``, ``O = P V``:
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``,
    ``dQ = dS K / sqrt(d_k)``, ``dK = dS^T Q / sqrt(d_k)``. Overwrites both outputs.
    """
    d = qkv.shape[1] // 3
    dk = d // H
    scale = qkv.dtype.type(1.0 / math.sqrt(dk))
    one = qkv.dtype.type(1.0)
    Qh = np.empty((T, dk), dtype=qkv.dtype)
    Kh = np.empty((T, dk), dtype=qkv.dtype)
    Vt = np.empty((dk, T), dtype=qkv.dtype)
    dOh = np.empty((T, dk), dtype=qkv.dtype)
    dS = np.empty((T, T), dtype=qkv.dtype)
    for b in range(B):
        base = b * T
        for h in range(H):
            off = h * dk
            _gather_head(qkv, base, T, off, Qh)
            _gather_head(qkv, base, T, d + off, Kh)
            _gather_head_transposed(qkv, base, T, 2 * d + off, Vt)
            _gather_head(dctx, base, T, off, dOh)
            _matmul_nt_into(dOh, Vt, dS, one)                        # dP = dO V^T  (T, T)
            for i in range(T):
                rowdot = dS[i, 0] * 0
                for j in range(T):
                    rowdot += dS[i, j] * P[b, h, i, j]
                for j in range(T):
                    dS[i, j] = P[b, h, i, j] * (dS[i, j] - rowdot) * scale
            # dQ = dS K, dK = dS^T Q, dV = P^T dO, written straight into the packed gradient
            for i in range(T):
                qi = base + i
                for c in range(dk):
                    dqkv[qi, off + c] = 0.0
                    dqkv[qi, d + off + c] = 0.0
                    dqkv[qi, 2 * d + off + c] = 0.0
            for i in range(T):
                qi = base + i
                for j in range(T):
                    kj = base + j
                    ds = dS[i, j]
                    p = P[b, h, i, j]
                    for c in range(dk):
                        dqkv[qi, off + c] += ds * Kh[j, c]
                        dqkv[kj, d + off + c] += ds * Qh[i, c]
                        dqkv[kj, 2 * d + off + c] += p * dOh[i, c]
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
