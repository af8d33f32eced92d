"""Numba kernels for the tiny encoder: the fused pieces between its matrix products.

The encoder is small (batch 64, T 16, d_model 32), so one NumPy call per elementwise step would
spend more time in Python than in arithmetic. Each kernel here fuses everything that lies between
two matrix products, forward or backward; the products themselves stay with NumPy's BLAS (``@``),
called from ``core/encoder.py``.

Layout: activations are flattened to ``(N, d)`` rows with ``N = T * B``, time-major (row
``t * B + b``); inside the attention kernels projections are ``(features, T, B)`` and the weights
``(H, T, T, B)``, so the innermost loops run over the batch. Every kernel writes into arrays the caller passes, so the
training loop allocates nothing it does not have to. No full ``fastmath``: the softmax relies on
``-inf``/``exp`` behaving exactly (the layer norms only reassociate their sums, see ``REDUCE``). No ``parallel``: at these sizes threads cost more than they save; ``nogil`` instead, so two
Streamlit sessions training at once really run side by side.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core.kernels.tuned.fastexp import exp_shifted_f32

# Reductions (layer-norm means and variances, bias gradients) are sums whose every add waits for the
# previous one; letting LLVM reassociate them (and fuse multiply-adds) vectorises them. These two
# flags change rounding only, never how NaN or infinity behave, unlike full ``fastmath``.
REDUCE = {"reassoc", "contract"}


# Activations are stored time-major: row ``t * B + b`` holds position t of sequence b. The
# attention kernels work on transposed projections, ``(features, T, B)``, so their innermost loops
# run over the batch (64 contiguous numbers) instead of over a head's 8 features: at these sizes
# short inner loops cost more in loop overhead than in arithmetic.

# ----------------------------------------------------------------------------------------------
# 0. embedding
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def embed_forward(tokens, embed, pos, out):
    """``out[t*B + b] = embed[tokens[b, t]] + pos[t]``; ``pos`` is (T, d) (zeros when unused)."""
    B, T = tokens.shape
    d = embed.shape[1]
    for t in range(T):
        for b in range(B):
            row = t * B + b
            tok = tokens[b, t]
            for j in range(d):
                out[row, j] = embed[tok, j] + pos[t, j]


@njit(cache=True, nogil=True)
def embed_backward(tokens, dh, d_embed, d_pos):
    """Scatter-add ``dh`` rows into ``d_embed`` (by token) and ``d_pos`` (by position); overwrites both."""
    B, T = tokens.shape
    d = d_embed.shape[1]
    d_embed[:, :] = 0.0
    d_pos[:, :] = 0.0
    for t in range(T):
        for b in range(B):
            row = t * B + b
            tok = tokens[b, t]
            for j in range(d):
                d_embed[tok, j] += dh[row, j]
                d_pos[t, j] += dh[row, j]


# ----------------------------------------------------------------------------------------------
# 1. multi-head attention core (between the packed QKV projection and W_O)
# ----------------------------------------------------------------------------------------------
# The vectorisable float32 exp (exp_shifted_f32) lives in core/kernels/tuned/fastexp.py, shared with the
# attention kernels.


@njit(cache=True, nogil=True, fastmath=REDUCE)
def attention_forward(qkvT, b_q, b_k, b_v, H, ctxT, P, fast_exp=False):
    """Per-head scaled dot-product attention on packed, transposed projections.

    ``qkvT`` (3d, T, B) holds ``(X [W_Q | W_K | W_V])^T``; the biases are added into it in place
    (the backward pass needs Q, K, V with biases). For every head ``P = softmax(Q_h K_h^T / sqrt(d_k))``
    is stored in ``P`` (H, T, T, B) and the head outputs ``(P V_h)^T`` in ``ctxT`` (d, T, B).
    ``fast_exp`` (float32 only): the softmax uses :func:`exp_shifted_f32`, which vectorises.
    """
    d3, T, B = qkvT.shape
    d = d3 // 3
    dk = d // H
    scale = 1.0 / math.sqrt(dk)
    for r in range(d):
        for t in range(T):
            for b in range(B):
                qkvT[r, t, b] += b_q[r]
                qkvT[d + r, t, b] += b_k[r]
                qkvT[2 * d + r, t, b] += b_v[r]
    mx = np.empty(B, dtype=qkvT.dtype)
    tot = np.empty(B, dtype=qkvT.dtype)
    ex = np.empty(B, dtype=np.float32)
    bits = np.empty(B, dtype=np.int32)
    scale2 = bits.view(np.float32)           # 2**n, written as float32 bit patterns into ``bits``
    for h in range(H):
        for i in range(T):
            # 1. scaled scores of query i against every key, for all sequences at once
            for j in range(T):
                for b in range(B):
                    P[h, i, j, b] = 0.0
                for c in range(h * dk, (h + 1) * dk):
                    for b in range(B):
                        P[h, i, j, b] += qkvT[c, i, b] * qkvT[d + c, j, b]
                for b in range(B):
                    P[h, i, j, b] *= scale
            # 2. softmax over keys j (minus the row max, so exp never overflows)
            for b in range(B):
                mx[b] = P[h, i, 0, b]
                tot[b] = 0.0
            for j in range(1, T):
                for b in range(B):
                    if P[h, i, j, b] > mx[b]:
                        mx[b] = P[h, i, j, b]
            for j in range(T):
                if fast_exp:
                    exp_shifted_f32(P[h, i, j], mx, ex, bits)
                    for b in range(B):
                        e = ex[b] * scale2[b]
                        P[h, i, j, b] = e
                        tot[b] += e
                else:
                    for b in range(B):
                        e = math.exp(P[h, i, j, b] - mx[b])
                        P[h, i, j, b] = e
                        tot[b] += e
            for b in range(B):
                tot[b] = 1.0 / tot[b]
            for j in range(T):
                for b in range(B):
                    P[h, i, j, b] *= tot[b]
            # 3. weighted sum of the values
            for c in range(h * dk, (h + 1) * dk):
                for b in range(B):
                    ctxT[c, i, b] = 0.0
                for j in range(T):
                    for b in range(B):
                        ctxT[c, i, b] += P[h, i, j, b] * qkvT[2 * d + c, j, b]


@njit(cache=True, nogil=True, fastmath=REDUCE)
def attention_backward(qkvT, P, dctxT, H, dqkvT, db_qkv):
    """Backward of :func:`attention_forward`: ``dqkvT`` (3d, T, B) and bias gradients ``db_qkv`` (3d,).

    With ``S = Q K^T / sqrt(d_k)``, ``P = softmax(S)``, ``O = P V``:
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``,
    ``dQ = dS K / sqrt(d_k)``, ``dK = dS^T Q / sqrt(d_k)``. Overwrites both outputs.
    """
    d3, T, B = qkvT.shape
    d = d3 // 3
    dk = d // H
    scale = 1.0 / math.sqrt(dk)
    dqkvT[:, :, :] = 0.0
    dS = np.empty((T, B), dtype=qkvT.dtype)
    rowdot = np.empty(B, dtype=qkvT.dtype)
    for h in range(H):
        for i in range(T):
            # dP[j] = dO_i . V_j and dV_j += P_ij dO_i
            for j in range(T):
                for b in range(B):
                    dS[j, b] = 0.0
                for c in range(h * dk, (h + 1) * dk):
                    for b in range(B):
                        g = dctxT[c, i, b]
                        dS[j, b] += g * qkvT[2 * d + c, j, b]
                        dqkvT[2 * d + c, j, b] += P[h, i, j, b] * g
            # through the softmax
            for b in range(B):
                rowdot[b] = 0.0
            for j in range(T):
                for b in range(B):
                    rowdot[b] += P[h, i, j, b] * dS[j, b]
            for j in range(T):
                for b in range(B):
                    dS[j, b] = P[h, i, j, b] * (dS[j, b] - rowdot[b]) * scale
            # dQ_i = sum_j dS_ij K_j ; dK_j += dS_ij Q_i
            for c in range(h * dk, (h + 1) * dk):
                for j in range(T):
                    for b in range(B):
                        dqkvT[c, i, b] += dS[j, b] * qkvT[d + c, j, b]
                        dqkvT[d + c, j, b] += dS[j, b] * qkvT[c, i, b]
    for r in range(d3):
        acc = 0.0
        for t in range(T):
            for b in range(B):
                acc += dqkvT[r, t, b]
        db_qkv[r] = acc


# ----------------------------------------------------------------------------------------------
# 2. residual + layer norm, feed-forward activation
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, fastmath=REDUCE)
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


@njit(cache=True, nogil=True, fastmath=REDUCE)
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


@njit(cache=True, nogil=True)
def bias_relu_forward(z, bias):
    """In place: ``z = max(z + bias, 0)``."""
    N, m = z.shape
    for n in range(N):
        for j in range(m):
            v = z[n, j] + bias[j]
            z[n, j] = v if v > 0.0 else 0.0


@njit(cache=True, nogil=True)
def relu_backward(da, a, dbias):
    """In place: ``da = da * (a > 0)`` (``a`` is the ReLU output); ``dbias`` = its column sums."""
    N, m = da.shape
    dbias[:] = 0.0
    for n in range(N):
        for j in range(m):
            if a[n, j] <= 0.0:
                da[n, j] = 0.0
            dbias[j] += da[n, j]


@njit(cache=True, nogil=True)
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
@njit(cache=True, nogil=True)
def mean_pool(h, B, T, out):
    """``out[b] = mean_t h[t*B + b]`` (overwrites ``out`` (B, d))."""
    d = h.shape[1]
    out[:, :] = 0.0
    for t in range(T):
        for b in range(B):
            for j in range(d):
                out[b, j] += h[t * B + b, j]
    for b in range(B):
        for j in range(d):
            out[b, j] /= T


@njit(cache=True, nogil=True)
def mean_pool_backward(dpooled, T, dh):
    """Each position receives ``dpooled[b] / T`` (overwrites ``dh`` (T*B, d))."""
    B, d = dpooled.shape
    for t in range(T):
        for b in range(B):
            for j in range(d):
                dh[t * B + b, j] = dpooled[b, j] / T


@njit(cache=True, nogil=True)
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
@njit(cache=True, nogil=True)
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
