"""The tiny encoder's compiled step: a forward pass, or a whole training step (forward, hand-written
backward and Adam), is one call into Numba.

    loss, hits = run(STEP, flat, layout, tokens, labels, pe, ln_eps, grads, adam, out)

(``core.model.tuned.classifier`` makes these calls: ``forward``, ``loss_and_grads``, ``train_step``, with
``layout`` from :func:`core.model.tuned.offsets.encoder_layout` and ``pe`` from
:func:`core.model.tuned.offsets.positions`; ``flat`` is packed in ``param_shapes(cfg)`` order.) At this size
(a 64 x 16 batch, d_model 32, two layers) the arithmetic of a step takes about a millisecond; a
step made of dozens of separate calls (NumPy products, small kernels, their allocations) spent
most of its time between them.

Determinism: the batch is cut into fixed chunks of :data:`CHUNK` sequences. Each chunk runs forward
and backward into a gradient buffer, and the buffers are added in chunk order. The products
are our own (``core.model.tuned.products``), not a BLAS: no thread pool, so the result depends
on the inputs alone, bit for bit: not on the number of threads, on other work in the process, or on
timing.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from core.kernels.tuned import simd
from core.model.tuned import JIT
from core.model.tuned.embedding_and_loss import (classify, classify_backward, column, cross_entropy, embed_backward,
                                       embed_forward, mean_pool)
from core.model.tuned.elementwise import adam_update
from core.model.tuned.sublayers import (EMBED, OUT_B, OUT_W, POS, _mat, feed_forward, feed_forward_backward,
                                            layer_views, packed_qkv, self_attention, self_attention_backward)

# Sequences per chunk: the unit of work whose gradients are summed in a fixed order. At T = 16, 16
# sequences make rows of 256 float32 (1 kB) and about 0.8 MB of activations, near the core's caches.
# Measured (batch 64, float32, 2-core x86-64): 8 sequences 2.7 ms per forward and backward, 16
# 2.3-2.6 ms, 32 from 2.4 to 6.5 ms from one process to the next (rows of 2 kB: the addresses of the
# arrays then often fall on the same cache sets), 64 slower still. Again on an AMD EPYC (Zen 4,
# AVX-512: 16 float32 lanes, so 16 sequences are one vector), 2026-12-06, the whole step on a fixed
# batch (4-vector product tiles, before the paired attention rows): 16 sequences 1.48 ms, 32
# 1.42-1.51 ms (within the noise), 64 3.1 ms (its 3 MB of activations, allocated for each chunk,
# came back from the system with ~900 page faults a step). 16 it stays: the same sums as before.
CHUNK = 16

# What the forward pass leaves for the backward pass, per layer i (chunk of Bp sequences, N = T Bp,
# lanes sequences to a SIMD vector, Bv = Bp / lanes vectors):
#   x[i] (d, N) the layer's input (x[L]: the encoder's output), qkv[i] (3d, N) queries, keys and values,
#   P[i] (H, Bv, T, T, lanes) attention weights, ctx[i] (d, N) heads' outputs, concatenated,
#   h1[i] (d, N) after LN1, xhat1[i] (d, N) and rstd1[i] (N,) LN1's normalised input and 1/std,
#   a[i] (d_ff, N) after the ReLU, xhat2[i] and rstd2[i] for LN2; pooled (d, Bp), logits (Bp, C).
Activations = namedtuple("Activations", ["x", "qkv", "P", "ctx", "h1", "xhat1", "rstd1", "a",
                                         "xhat2", "rstd2", "pooled", "logits"])


@njit(**JIT)
def new_activations(lay, T, Bp, like):
    """Room for one chunk's :data:`Activations` (dtype of the array ``like``); ``Bp`` sequences,
    a whole number of SIMD vectors."""
    L, d, H, F, N = lay.layers.shape[0], lay.d_model, lay.n_heads, lay.d_ff, T * Bp
    dt = like.dtype
    lanes = simd.lanes_of(like)
    return Activations(np.empty((L + 1, d, N), dt), np.empty((L, 3 * d, N), dt),
                       np.empty((L, H, Bp // lanes, T, T, lanes), dt), np.empty((L, d, N), dt),
                       np.empty((L, d, N), dt), np.empty((L, d, N), dt), np.empty((L, N), dt),
                       np.empty((L, F, N), dt), np.empty((L, d, N), dt), np.empty((L, N), dt),
                       np.empty((d, Bp), dt), np.empty((Bp, lay.n_out), dt))


@njit(inline="always", **JIT)
def forward_chunk(flat, lay, Wqkv, bqkv, tokens, pe, eps, acts):
    """The encoder on a chunk's ``tokens`` (Bp, T), everything kept in ``acts``; ``pe`` (>= T, d)."""
    L, d = lay.layers.shape[0], lay.d_model
    # 1. h = embed[tokens] + PE                                                   x[0]: (d, N)
    embed_forward(tokens, _mat(flat, lay.top[EMBED], lay.vocab_size, d), pe, acts.x[0])
    # 2.-6. the layers                                                            x[L]: (d, N)
    encoder_layers(flat, lay, Wqkv, bqkv, eps, acts)
    # 7. logits = mean over positions of h, then classifier.W and .b   pooled: (d, Bp), logits: (Bp, C)
    mean_pool(acts.x[L], tokens.shape[1], acts.pooled)
    classify(acts.pooled, _mat(flat, lay.top[OUT_W], d, lay.n_out),
               flat[lay.top[OUT_B]:lay.top[OUT_B] + lay.n_out], acts.logits)


@njit(**JIT)
def encoder_layers(flat, lay, Wqkv, bqkv, eps, acts):
    """Every layer, from ``acts.x[0]`` to ``acts.x[L]``, keeping what the backward pass needs."""
    sub = np.empty_like(acts.x[0])                 # a sublayer's output, before residual and norm
    for i in range(lay.layers.shape[0]):
        p = layer_views(flat, lay, i)
        self_attention(p, Wqkv[i], bqkv[i], acts.x[i], False, eps, acts.qkv[i], acts.P[i], acts.ctx[i],
                       sub, acts.h1[i], acts.xhat1[i], acts.rstd1[i])
        feed_forward(p, acts.h1[i], eps, acts.a[i], sub, acts.x[i + 1], acts.xhat2[i], acts.rstd2[i])


@njit(inline="always", **JIT)
def backward_chunk(flat, grads, lay, Wqkv, tokens, labels, batch, acts):
    """Cross-entropy of the chunk (summed over its ``len(labels)`` real sequences, in float64) and
    the number of hits; writes the chunk's share of the gradient of the mean loss over ``batch``
    sequences into ``grads`` (every entry)."""
    Bp, T = tokens.shape
    d, C, N = lay.d_model, lay.n_out, T * Bp
    dt = flat.dtype
    dh = np.empty((d, N), dt)            # gradient of a layer's output (of x[i+1])
    dlogits = np.empty((Bp, C), dt)
    # 7'. loss, classifier and the mean over positions
    loss, hits = cross_entropy(acts.logits, labels, 1.0 / batch, dlogits)       # padding rows: 0
    classify_backward(acts.pooled, _mat(flat, lay.top[OUT_W], d, C), dlogits, T,
                        _mat(grads, lay.top[OUT_W], d, C), grads[lay.top[OUT_B]:lay.top[OUT_B] + C], dh)
    # 6'.-2'. the layers, last first
    encoder_layers_backward(flat, grads, lay, Wqkv, acts, dh)
    # 1'. embeddings and (learned) positions
    d_embed = _mat(grads, lay.top[EMBED], lay.vocab_size, d)
    if lay.learned_positions:
        d_pos = _mat(grads, lay.top[POS], lay.n_ctx, d)
    else:
        d_pos = np.empty((T, d), dt)
    embed_backward(tokens, dh, d_embed, d_pos)
    return loss, hits


@njit(**JIT)
def encoder_layers_backward(flat, grads, lay, Wqkv, acts, dh):
    """Backward of :func:`encoder_layers`: ``dh`` (d, N) arrives as the gradient of ``x[L]`` and
    leaves as that of ``x[0]``; the layers' gradients go to ``grads``."""
    d, F, N = lay.d_model, lay.d_ff, dh.shape[1]
    dt = flat.dtype
    dr, dh1, dctx = np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt)
    da, dqkv = np.empty((F, N), dt), np.empty((3 * d, N), dt)
    for i in range(lay.layers.shape[0] - 1, -1, -1):
        p, g = layer_views(flat, lay, i), layer_views(grads, lay, i)
        feed_forward_backward(p, g, dh, acts.xhat2[i], acts.rstd2[i], acts.a[i], acts.h1[i], dr, da, dh1)
        self_attention_backward(p, g, Wqkv[i], dh1, acts.xhat1[i], acts.rstd1[i], acts.x[i], acts.qkv[i],
                                acts.P[i], acts.ctx[i], dr, dctx, dqkv, dh)


@njit(**JIT)
def padded_chunk(tokens, b0, b1, like):
    """Sequences ``b0:b1`` of ``tokens``, followed by sequences of token 0 up to a whole number of
    SIMD vectors (of ``like``'s dtype): the attention kernels' lanes. A padding sequence gets no
    loss, so a zero gradient, and adds exact zeros to the weights' gradients."""
    L = simd.lanes_of(like)
    Bp = (b1 - b0 + L - 1) // L * L
    chunk = np.zeros((Bp, tokens.shape[1]), np.int64)
    for b in range(b1 - b0):
        for t in range(tokens.shape[1]):
            chunk[b, t] = tokens[b0 + b, t]
    return chunk


# What one call of :func:`run` does
FORWARD, GRADIENT, STEP = 0, 1, 2


@njit(**JIT)
def run(mode, flat, lay, tokens, labels, pe, eps, grads, adam, out):
    """The one compiled entry point: the encoder on a batch, chunk by chunk, then by ``mode``

    - ``FORWARD``: the logits into ``out = (logits (B, C), attn, hidden, pooled)``, and when they
      are not empty the attention weights ``attn`` (L, B, H, T, T), the encoder's output ``hidden``
      (B, T, d) and its mean over positions ``pooled`` (B, d); returns ``(0.0, 0)``;
    - ``GRADIENT``: the backward pass too, the gradient of the batch's mean loss into ``grads``;
      returns the mean cross-entropy and the number of arg-max hits;
    - ``STEP``: then Adam, ``adam = (m, v, lr, beta1, beta2, eps, t)``, updates ``flat`` in place.

    The chunks' gradients are added in chunk order.
    """
    B, T = tokens.shape
    L, d, H = lay.layers.shape[0], lay.d_model, lay.n_heads
    logits, attn, hidden, pooled = out
    lanes = simd.lanes_of(flat)
    n_chunks = (B + CHUNK - 1) // CHUNK
    Wqkv, bqkv = packed_qkv(flat, lay)
    # the first chunk's gradient goes straight to grads, each later one to chunk_grads, then added:
    # grads = ((g_0 + g_1) + g_2) + ..., chunk order
    chunk_grads = np.empty(flat.size if mode != FORWARD and n_chunks > 1 else 0, flat.dtype)
    losses = np.zeros(n_chunks)
    hits = np.zeros(n_chunks, np.int64)
    for ci in range(n_chunks):
        b0, b1 = ci * CHUNK, min(B, (ci + 1) * CHUNK)
        chunk = padded_chunk(tokens, b0, b1, flat)
        Bp = chunk.shape[0]
        acts = new_activations(lay, T, Bp, flat)
        forward_chunk(flat, lay, Wqkv, bqkv, chunk, pe, eps, acts)
        if mode != FORWARD:
            into = grads if ci == 0 else chunk_grads
            losses[ci], hits[ci] = backward_chunk(flat, into, lay, Wqkv, chunk, labels[b0:b1], B, acts)
            if ci > 0:
                add_into(grads, chunk_grads)
            continue
        # what a forward pass shows: back from the chunk's layout to (sequence, position, ...)
        for b in range(b1 - b0):
            for k in range(logits.shape[1]):
                logits[b0 + b, k] = acts.logits[b, k]
        if attn.size:
            for b in range(b1 - b0):
                vec, lane = b // lanes, b % lanes
                for c in range(d):
                    pooled[b0 + b, c] = acts.pooled[c, b]
                    for t in range(T):
                        hidden[b0 + b, t, c] = acts.x[L, c, column(b, t, T, lanes)]
                for i in range(L):
                    for h in range(H):
                        for q in range(T):
                            for k in range(T):
                                attn[i, b0 + b, h, q, k] = acts.P[i, h, vec, q, k, lane]
    if mode == FORWARD:
        return 0.0, 0
    # the chunks' losses and hits, added in chunk order
    loss, hit = losses[0], hits[0]
    for ci in range(1, n_chunks):
        loss += losses[ci]
        hit += hits[ci]
    if mode == STEP:
        moment1, moment2, lr, beta1, beta2, adam_eps, t = adam
        adam_update(flat, grads, moment1, moment2, lr, beta1, beta2, adam_eps, t)
    return loss / B, hit


@njit(**JIT)
def add_in_order(partial, out):
    """``out = partial[0] + partial[1] + ...``, added in that order: the same bits however the
    chunks were computed. (One chunk's buffer at a time, along its length: in SIMD lanes.)"""
    out[:] = partial[0]
    for ci in range(1, partial.shape[0]):
        add_into(out, partial[ci])


@njit(**JIT)
def add_into(out, part):
    """``out += part``, element by element."""
    for n in range(out.shape[0]):
        out[n] += part[n]
