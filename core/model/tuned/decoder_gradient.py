"""The decoder's compiled loss and gradient (``core.model.tuned.decoder_loss`` calls it): the encoder's
sublayers in a decoder's order, plus causal masks and cross-attention.

A decoder block (core/model/decoder.py) is an encoder block with a causal mask and, in an
encoder-decoder, a cross-attention sublayer between its self-attention and its feed-forward:
    x -> h1 = LN1(x + MHA(x, causal)) -> h2 = LN_cross(h1 + MHA(h1, over m)) -> LN2(h2 + FFN(h2))
The encoder's output m (the "memory") gives the keys and values of every cross-attention. The
offsets come from the one layout builder, :func:`core.model.tuned.offsets.decoder_layout`.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit

from core.kernels.tuned import simd
from core.model.tuned import JIT
from core.model.tuned.attention import attention_backward, attention_forward
from core.model.tuned.embedding_and_loss import column, embed_backward, embed_forward
from core.model.tuned.encoder_step import (CHUNK, add_in_order, encoder_layers, encoder_layers_backward,
                                               new_activations, padded_chunk)
from core.model.tuned.products import gram, project
from core.model.tuned.elementwise import add_bias, layernorm_backward, residual_layernorm, row_sums
from core.model.tuned.sublayers import (EMBED, OUT_B, OUT_W, POS, _mat, feed_forward, feed_forward_backward,
                                            layer_views, packed_qkv, self_attention, self_attention_backward)

# A decoder block's cross-attention arrays (dec.blocks.{i}.cross.*, dec.blocks.{i}.ln_cross.*), in the
# order of their slots (DecoderLayout.cross' columns); a Cross's fields are the same names with "_"
# for "." (c.cross_W_Q, c.ln_cross_g), as a Layer's.
CROSS_SLOTS = ("cross.W_Q", "cross.W_K", "cross.W_V", "cross.W_O", "cross.b_Q", "cross.b_K", "cross.b_V",
               "cross.b_O", "ln_cross.g", "ln_cross.b")
Cross = namedtuple("Cross", [slot.replace(".", "_") for slot in CROSS_SLOTS])
DecoderLayout = namedtuple("DecoderLayout", ["enc", "dec", "cross"])
DecoderLayout.__doc__ = """Where a decoder's parameters start in its flat buffer.

``enc``, ``dec``: a :data:`Layout` each, for the encoder's and the decoder's stacks (their
self-attention and feed-forward sublayers; ``dec.top`` holds ``unembed`` and ``unembed_b`` where
an encoder holds its classifier, ``dec.n_out`` is the vocabulary); a decoder-only model's
``enc`` has no layers. ``cross`` (L, 10): each decoder block's cross-attention arrays, in
the :data:`CROSS_SLOTS` order (no rows without cross-attention). Sublayers a model lacks (the
feed-forward one when ``d_ff = 0``) have offset 0: their views are never read."""
# The cross-attention sublayers' activations, per decoder layer i: cq[i] (d, N) queries, ckv[i]
# (2d, Ns) keys and values of the memory, Pc[i] (H, Bv, T, S, lanes) weights, cctx[i] (d, N)
# heads' outputs, h2[i] (d, N) after LN_cross, xhatc[i] and rstdc[i] for that norm.
CrossActivations = namedtuple("CrossActivations", ["cq", "ckv", "Pc", "cctx", "h2", "xhatc", "rstdc"])


@njit(**JIT)
def cross_views(flat, lay, i):
    """Decoder layer ``i``'s cross-attention arrays as views of ``flat``."""
    d = lay.dec.d_model
    at = lay.cross[i]
    return Cross(_mat(flat, at[0], d, d), _mat(flat, at[1], d, d), _mat(flat, at[2], d, d),
                 _mat(flat, at[3], d, d), flat[at[4]:at[4] + d], flat[at[5]:at[5] + d],
                 flat[at[6]:at[6] + d], flat[at[7]:at[7] + d], flat[at[8]:at[8] + d], flat[at[9]:at[9] + d])


@njit(**JIT)
def packed_kv(flat, lay):
    """``[W_K | W_V]`` (L, d, 2d) and ``[b_K | b_V]`` (L, 2d) of every cross-attention: the memory's
    keys and values in one projection."""
    L, d = lay.cross.shape[0], lay.dec.d_model
    W = np.empty((L, d, 2 * d), flat.dtype)
    b = np.empty((L, 2 * d), flat.dtype)
    for i in range(L):
        c = cross_views(flat, lay, i)
        W[i, :, :d] = c.cross_W_K
        W[i, :, d:] = c.cross_W_V
        b[i, :d] = c.cross_b_K
        b[i, d:] = c.cross_b_V
    return W, b


@njit(**JIT)
def cross_attention(c, Wkv, bkv, h1, memory, eps, cq, ckv, Pc, cctx, sub, h2, xhatc, rstdc):
    """``h2 = LN_cross(h1 + MHA(queries from h1, keys and values from memory) + b_O)``."""
    d = h1.shape[0]
    project(c.cross_W_Q, h1, cq, cq, False)          # q = (h1 W_Q + b_Q)^T              (d, N)
    add_bias(cq, c.cross_b_Q)
    project(Wkv, memory, ckv, ckv, False)            # [k; v] = (m [W_K | W_V] + ...)^T (2d, Ns)
    add_bias(ckv, bkv)
    attention_forward(cq, 0, ckv, 0, d, False, Pc, cctx)
    project(c.cross_W_O, cctx, sub, sub, False)
    residual_layernorm(h1, sub, c.cross_b_O, c.ln_cross_g, c.ln_cross_b, eps, h2, xhatc, rstdc)


@njit(**JIT)
def cross_attention_backward(c, gc, Wkv, dh2, xhatc, rstdc, h1, memory, cq, ckv, Pc, cctx, dr, dcctx, dcq,
                             dckv, dW_kv, db_kv, scratch, dmemory, dh1):
    """Backward of :func:`cross_attention`: ``dh1`` from ``dh2``, and the memory's share added to
    ``dmemory`` (d, Ns); ``dr`` ... ``scratch`` are scratch."""
    d = h1.shape[0]
    layernorm_backward(dh2, xhatc, rstdc, c.ln_cross_g, dr, gc.ln_cross_g, gc.ln_cross_b)
    row_sums(dr, gc.cross_b_O)
    gram(cctx, dr, gc.cross_W_O)                     # dW_O = cctx^T dr
    project(c.cross_W_O.T, dr, dcctx, dcctx, False)
    attention_backward(cq, 0, ckv, 0, d, Pc, dcctx, dcq, dckv)
    row_sums(dcq, gc.cross_b_Q)
    gram(h1, dcq, gc.cross_W_Q)                      # dW_Q = h1^T dq
    project(c.cross_W_Q.T, dcq, dr, dh1, True)       # dh1 = dr + dq W_Q^T (the residual path adds dr)
    row_sums(dckv, db_kv)
    gram(memory, dckv, dW_kv)                        # [dW_K | dW_V] = m^T [dk dv]
    gc.cross_W_K[:, :] = dW_kv[:, :d]
    gc.cross_W_V[:, :] = dW_kv[:, d:]
    gc.cross_b_K[:] = db_kv[:d]
    gc.cross_b_V[:] = db_kv[d:]
    project(Wkv.T, dckv, dmemory, scratch, True)     # dm += [dk dv] [W_K | W_V]^T
    dmemory[:, :] = scratch


@njit(**JIT)
def token_cross_entropy(logits, targets, n_real, scale, dlogits):
    """Summed cross-entropy (float64) of every position of the first ``n_real`` sequences of
    ``targets`` (Bp, T) under ``logits`` (V, N); ``dlogits = (softmax - onehot) * scale`` there, 0
    in the padding sequences' columns."""
    V = logits.shape[0]
    T = targets.shape[1]
    L = simd.lanes_of(logits)
    dlogits[:, :] = 0.0
    loss = 0.0
    for b in range(n_real):
        for t in range(T):
            n, y = column(b, t, T, L), targets[b, t]
            top = logits[0, n]
            for k in range(1, V):
                top = max(top, logits[k, n])
            total = 0.0
            for k in range(V):
                total += math.exp(logits[k, n] - top)
            loss += math.log(total) + top - logits[y, n]
            for k in range(V):
                dlogits[k, n] = math.exp(logits[k, n] - top) / total * scale
            dlogits[y, n] -= scale
    return loss


@njit(**JIT)
def decoder_chunk(flat, grads, lay, packed, src, tgt_in, tgt_out, n_real, scale, pe_src, pe_tgt, eps):
    """Forward and backward on one chunk (sequences padded to whole vectors); the chunk's share of
    the gradient into ``grads`` (every entry). Returns its summed cross-entropy."""
    Wqkv_e, bqkv_e, Wqkv_d, bqkv_d, Wkv, bkv = packed
    enc, dec = lay.enc, lay.dec
    Bp, T = tgt_in.shape
    S = src.shape[1]
    L, d, H, V = Wqkv_d.shape[0], dec.d_model, dec.n_heads, dec.n_out     # L: the target stack's blocks
    N, Ns, lanes, dt = T * Bp, S * Bp, simd.lanes_of(flat), flat.dtype
    Lc = lay.cross.shape[0]                        # L with cross-attention, 0 without
    cross = Lc > 0
    # forward: the encoder (encoder-decoder only), then the decoder, keeping what the backward needs
    ea = new_activations(enc, S, Bp, flat)
    if cross:
        embed_forward(src, _mat(flat, enc.top[EMBED], enc.vocab_size, d), pe_src, ea.x[0])
        encoder_layers(flat, enc, Wqkv_e, bqkv_e, eps, ea)
    memory = ea.x[ea.x.shape[0] - 1]                                             # (d, Ns)
    da = new_activations(dec, T, Bp, flat)
    ca = CrossActivations(np.empty((Lc, d, N), dt), np.empty((Lc, 2 * d, Ns), dt),
                          np.empty((Lc, H, Bp // lanes, T, S, lanes), dt), np.empty((Lc, d, N), dt),
                          np.empty((Lc, d, N), dt), np.empty((Lc, d, N), dt), np.empty((Lc, N), dt))
    sub = np.empty((d, N), dt)
    embed_forward(tgt_in, _mat(flat, dec.top[EMBED], dec.vocab_size, d), pe_tgt, da.x[0])
    for i in range(L):
        p = layer_views(flat, dec, i)
        self_attention(p, Wqkv_d[i], bqkv_d[i], da.x[i], True, eps, da.qkv[i], da.P[i], da.ctx[i],
                       sub, da.h1[i], da.xhat1[i], da.rstd1[i])
        mid = da.h1[i]
        if cross:
            cross_attention(cross_views(flat, lay, i), Wkv[i], bkv[i], da.h1[i], memory, eps, ca.cq[i],
                            ca.ckv[i], ca.Pc[i], ca.cctx[i], sub, ca.h2[i], ca.xhatc[i], ca.rstdc[i])
            mid = ca.h2[i]
        feed_forward(p, mid, eps, da.a[i], sub, da.x[i + 1], da.xhat2[i], da.rstd2[i])
    logits, dlogits = np.empty((V, N), dt), np.empty((V, N), dt)
    unembed = _mat(flat, dec.top[OUT_W], d, V)
    project(unembed, da.x[L], logits, logits, False)        # logits = (x unembed + unembed_b)^T  (V, N)
    add_bias(logits, flat[dec.top[OUT_B]:dec.top[OUT_B] + V])
    loss = token_cross_entropy(logits, tgt_out, n_real, scale, dlogits)
    # backward, the same steps in reverse
    dh = np.empty((d, N), dt)
    row_sums(dlogits, grads[dec.top[OUT_B]:dec.top[OUT_B] + V])
    gram(da.x[L], dlogits, _mat(grads, dec.top[OUT_W], d, V))
    project(unembed.T, dlogits, dh, dh, False)               # dx = dlogits unembed^T
    F = dec.d_ff
    dr, dmid, dh1, dctx = np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt)
    d_a, dqkv = np.empty((F, N), dt), np.empty((3 * d, N), dt)
    dmemory, scratch = np.zeros((d, Ns), dt), np.empty((d, Ns), dt)
    dcq, dckv = np.empty((d, N), dt), np.empty((2 * d, Ns), dt)
    dW_kv, db_kv = np.empty((d, 2 * d), dt), np.empty(2 * d, dt)
    for i in range(L - 1, -1, -1):
        p, g = layer_views(flat, dec, i), layer_views(grads, dec, i)
        mid = ca.h2[i] if cross else da.h1[i]
        feed_forward_backward(p, g, dh, da.xhat2[i], da.rstd2[i], da.a[i], mid, dr, d_a, dmid)
        d_in = dmid
        if cross:
            cross_attention_backward(cross_views(flat, lay, i), cross_views(grads, lay, i), Wkv[i], dmid,
                                     ca.xhatc[i], ca.rstdc[i], da.h1[i], memory, ca.cq[i], ca.ckv[i],
                                     ca.Pc[i], ca.cctx[i], dr, dctx, dcq, dckv, dW_kv, db_kv, scratch,
                                     dmemory, dh1)
            d_in = dh1
        self_attention_backward(p, g, Wqkv_d[i], d_in, da.xhat1[i], da.rstd1[i], da.x[i], da.qkv[i],
                                da.P[i], da.ctx[i], dr, dctx, dqkv, dh)
    embed_backward(tgt_in, dh, _mat(grads, dec.top[EMBED], dec.vocab_size, d), _positions(grads, dec, T))
    if cross:
        encoder_layers_backward(flat, grads, enc, Wqkv_e, ea, dmemory)
        embed_backward(src, dmemory, _mat(grads, enc.top[EMBED], enc.vocab_size, d), _positions(grads, enc, S))
    return loss


@njit(**JIT)
def _positions(grads, lay, T):
    """Where the gradient of the positions goes: the learned table, or scratch."""
    if lay.learned_positions:
        return _mat(grads, lay.top[POS], lay.n_ctx, lay.d_model)
    return np.empty((T, lay.d_model), grads.dtype)


@njit(**JIT)
def decoder_gradient(flat, lay, src, tgt_in, tgt_out, pe_src, pe_tgt, eps, grads):
    """The mean cross-entropy over every target position of the batch, and its gradient into
    ``grads``: ``src`` (B, S) (an empty (B, 0) for a decoder-only model), ``tgt_in`` and ``tgt_out``
    (B, T); ``pe_src`` (S, d) and ``pe_tgt`` (T, d) the positions added to the embeddings.

    Chunk by chunk as :func:`run`: each chunk's gradient goes to a buffer of its own; they are
    added in chunk order, so the result does not depend on threads or timing."""
    B, T = tgt_in.shape
    n_chunks = (B + CHUNK - 1) // CHUNK
    Wqkv_e, bqkv_e = packed_qkv(flat, lay.enc)
    Wqkv_d, bqkv_d = packed_qkv(flat, lay.dec)
    Wkv, bkv = packed_kv(flat, lay)
    packed = (Wqkv_e, bqkv_e, Wqkv_d, bqkv_d, Wkv, bkv)
    partial = np.zeros((n_chunks, flat.size), flat.dtype)
    loss = 0.0
    for ci in range(n_chunks):
        b0, b1 = ci * CHUNK, min(B, (ci + 1) * CHUNK)
        loss += decoder_chunk(flat, partial[ci], lay, packed, padded_chunk(src, b0, b1, flat),
                              padded_chunk(tgt_in, b0, b1, flat), padded_chunk(tgt_out, b0, b1, flat), b1 - b0,
                              1.0 / (B * T), pe_src, pe_tgt, eps)
    add_in_order(partial, grads)
    return loss / (B * T)
