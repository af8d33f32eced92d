"""The tiny encoder's training step as one compiled call: forward, hand-written backward and Adam.

    loss, hits = run(STEP, flat, layout, tokens, labels, pe, ln_eps, grads, adam, out)

(``core.encoder`` makes these calls: ``forward``, ``loss_and_grads``, ``train_step``.) At this size (a 64 x 16 batch, d_model 32, two layers) the arithmetic of a step takes well under
a millisecond; a step made of dozens of separate calls (NumPy products, small kernels, their
allocations) spent most of its time between them. Here Python makes one call per step.

Parameters live in one flat buffer (``core.encoder.pack``, in ``core.encoder.param_shapes``
order) and are read through a :data:`Layout`: the sizes and the offset of every array. Gradients
go to a buffer of the same layout.

Determinism: the batch is cut into fixed chunks of :data:`CHUNK` sequences. Each chunk runs forward
and backward into its own gradient buffer, and the buffers are added in chunk order. No BLAS and
no thread pool is involved, so the result depends on the inputs alone, bit for bit: not on the
number of threads, on other work in the process, or on timing.

Activations are transposed, ``(features, N)``: one row per feature, one column per token of the
chunk (``N = T * Bp`` for ``Bp`` sequences, padded to whole SIMD vectors; columns in the order of
``core.encoder_kernels.column``).
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from core import encoder_kernels as K
from core.kernels.tuned import simd

# Sequences per chunk: the unit of work whose gradients are summed in a fixed order. At T = 16, 16
# sequences make rows of 256 float32 (1 kB) and about 0.8 MB of activations, near the core's caches.
# Measured (batch 64, float32, 2-core x86-64): 8 sequences 2.7 ms per forward and backward, 16
# 2.3-2.6 ms, 32 from 2.4 to 6.5 ms from one process to the next (rows of 2 kB: the addresses of the
# arrays then often fall on the same cache sets), 64 slower still.
CHUNK = 16

LAYER_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
                "ln1_g", "ln1_b", "ln2_g", "ln2_b", "W_1", "b_1", "W_2", "b_2")
# Offsets of the arrays outside the layers, in Layout.top
EMBED, POS, W_CLS, B_CLS = 0, 1, 2, 3

Layout = namedtuple("Layout", ["vocab_size", "seq_len", "d_model", "n_heads", "d_ff", "n_classes",
                               "learned_positions", "top", "layers"])
Layout.__doc__ = """Sizes of the model and where each parameter starts in the flat buffer.

``top`` (4,): offsets of ``embed``, ``pos`` (-1 without learned positions), ``W_cls``, ``b_cls``;
``layers`` (L, 16): offsets of each layer's arrays, in ``LAYER_PARAMS`` order."""

Layer = namedtuple("Layer", LAYER_PARAMS)

# What the forward pass leaves for the backward pass, per layer i (chunk of Bp sequences, N = T Bp,
# lanes sequences to a SIMD vector, Bv = Bp / lanes vectors):
#   x[i] (d, N) the layer's input (x[L]: the encoder's output), qkv[i] (3d, N) queries, keys and values,
#   P[i] (H, Bv, T, T, lanes) attention weights, ctx[i] (d, N) heads' outputs, concatenated,
#   h1[i] (d, N) after LN1, xhat1[i] (d, N) and rstd1[i] (N,) LN1's normalised input and 1/std,
#   a[i] (d_ff, N) after the ReLU, xhat2[i] and rstd2[i] for LN2; pooled (d, Bp), logits (Bp, C).
Activations = namedtuple("Activations", ["x", "qkv", "P", "ctx", "h1", "xhat1", "rstd1", "a",
                                         "xhat2", "rstd2", "pooled", "logits"])

_jit = dict(cache=True, nogil=True, error_model="numpy")     # as in core/encoder_kernels.py


# ----------------------------------------------------------------------------------------------
# parameters and activations
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
def _mat(flat, at, rows, cols):
    """The (rows, cols) array stored from ``flat[at]`` on (a view)."""
    return flat[at:at + rows * cols].reshape((rows, cols))


@njit(**_jit)
def layer_views(flat, lay, i):
    """Layer ``i``'s arrays as views of ``flat`` (parameters or gradients)."""
    d, F = lay.d_model, lay.d_ff
    at = lay.layers[i]
    return Layer(_mat(flat, at[0], d, d), _mat(flat, at[1], d, d), _mat(flat, at[2], d, d),
                 _mat(flat, at[3], d, d), flat[at[4]:at[4] + d], flat[at[5]:at[5] + d],
                 flat[at[6]:at[6] + d], flat[at[7]:at[7] + d], flat[at[8]:at[8] + d],
                 flat[at[9]:at[9] + d], flat[at[10]:at[10] + d], flat[at[11]:at[11] + d],
                 _mat(flat, at[12], d, F), flat[at[13]:at[13] + F], _mat(flat, at[14], F, d),
                 flat[at[15]:at[15] + d])


@njit(**_jit)
def packed_qkv(flat, lay):
    """``[W_Q | W_K | W_V]`` (L, d, 3d) and ``[b_Q | b_K | b_V]`` (L, 3d) of every layer: one
    projection of 3d outputs instead of three of d (longer tiles)."""
    L, d = lay.layers.shape[0], lay.d_model
    W = np.empty((L, d, 3 * d), flat.dtype)
    b = np.empty((L, 3 * d), flat.dtype)
    for i in range(L):
        p = layer_views(flat, lay, i)
        for r in range(d):
            for c in range(d):
                W[i, r, c] = p.W_Q[r, c]
                W[i, r, d + c] = p.W_K[r, c]
                W[i, r, 2 * d + c] = p.W_V[r, c]
        for c in range(d):
            b[i, c], b[i, d + c], b[i, 2 * d + c] = p.b_Q[c], p.b_K[c], p.b_V[c]
    return W, b


@njit(**_jit)
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
                       np.empty((d, Bp), dt), np.empty((Bp, lay.n_classes), dt))


# ----------------------------------------------------------------------------------------------
# forward and backward of one chunk
# ----------------------------------------------------------------------------------------------
@njit(inline="always", **_jit)
def forward_chunk(flat, lay, Wqkv, bqkv, tokens, pe, eps, acts):
    """The encoder on a chunk's ``tokens`` (Bp, T), everything kept in ``acts``; ``pe`` (>= T, d)."""
    Bp, T = tokens.shape
    L, d, H, N = lay.layers.shape[0], lay.d_model, lay.n_heads, T * Bp
    sub = np.empty((d, N), flat.dtype)             # a sublayer's output, before residual and norm
    # 1. h = embed[tokens] + PE                                                   x[0]: (d, N)
    K.embed_forward(tokens, _mat(flat, lay.top[EMBED], lay.vocab_size, d), pe, acts.x[0])
    for i in range(L):
        p = layer_views(flat, lay, i)
        x, qkv, ctx, h1, a = acts.x[i], acts.qkv[i], acts.ctx[i], acts.h1[i], acts.a[i]
        # 2. [q; k; v] = (h [W_Q | W_K | W_V] + [b_Q | b_K | b_V])^T                qkv: (3d, N)
        K.project(Wqkv[i], x, qkv, qkv, False)
        K.add_bias(qkv, bqkv[i])
        # 3. every head: P = softmax(q k^T / sqrt(d_k)), its output P v   P: (H, Bv, T, T, lanes), ctx: (d, N)
        K.attention_forward(qkv, H, acts.P[i], ctx)
        # 4. h1 = LN1(h + ctx W_O + b_O)                                              h1: (d, N)
        K.project(p.W_O, ctx, sub, sub, False)
        K.residual_layernorm(x, sub, p.b_O, p.ln1_g, p.ln1_b, eps, h1, acts.xhat1[i], acts.rstd1[i])
        # 5. a = relu(h1 W_1 + b_1)                                                 a: (d_ff, N)
        K.project(p.W_1, h1, a, a, False)
        K.bias_relu(a, p.b_1)
        # 6. h = LN2(h1 + a W_2 + b_2), the next layer's input                    x[i+1]: (d, N)
        K.project(p.W_2, a, sub, sub, False)
        K.residual_layernorm(h1, sub, p.b_2, p.ln2_g, p.ln2_b, eps, acts.x[i + 1], acts.xhat2[i], acts.rstd2[i])
    # 7. logits = mean over positions of h, then W_cls and b_cls       pooled: (d, Bp), logits: (Bp, C)
    K.mean_pool(acts.x[L], T, acts.pooled)
    K.classify(acts.pooled, _mat(flat, lay.top[W_CLS], d, lay.n_classes),
               flat[lay.top[B_CLS]:lay.top[B_CLS] + lay.n_classes], acts.logits)


@njit(inline="always", **_jit)
def backward_chunk(flat, grads, lay, Wqkv, tokens, labels, batch, acts):
    """Cross-entropy of the chunk (summed over its ``len(labels)`` real sequences, in float64) and
    the number of hits; writes the chunk's share of the gradient of the mean loss over ``batch``
    sequences into ``grads`` (every entry)."""
    Bp, T = tokens.shape
    L, d, H, F, C, N = lay.layers.shape[0], lay.d_model, lay.n_heads, lay.d_ff, lay.n_classes, T * Bp
    dt = flat.dtype
    dh = np.empty((d, N), dt)            # gradient of a layer's output (of x[i+1])
    dr = np.empty((d, N), dt)            # gradient of a residual sum, before its layer norm
    dh1 = np.empty((d, N), dt)
    da = np.empty((F, N), dt)
    dctx = np.empty((d, N), dt)
    dqkv = np.empty((3 * d, N), dt)
    dW_qkv = np.empty((d, 3 * d), dt)
    db_qkv = np.empty(3 * d, dt)
    dlogits = np.empty((Bp, C), dt)
    # 7'. loss, classifier and the mean over positions
    loss, hits = K.cross_entropy(acts.logits, labels, 1.0 / batch, dlogits)       # padding rows: 0
    K.classify_backward(acts.pooled, _mat(flat, lay.top[W_CLS], d, C), dlogits, T,
                        _mat(grads, lay.top[W_CLS], d, C), grads[lay.top[B_CLS]:lay.top[B_CLS] + C], dh)
    for i in range(L - 1, -1, -1):
        p, g = layer_views(flat, lay, i), layer_views(grads, lay, i)
        # 6'. through LN2; dr is the gradient of h1 + a W_2 + b_2
        K.layernorm_backward(dh, acts.xhat2[i], acts.rstd2[i], p.ln2_g, dr, g.ln2_g, g.ln2_b)
        K.row_sums(dr, g.b_2)
        K.gram(acts.a[i], dr, g.W_2)                       # dW_2 = a^T dr
        # 5'. through W_2, the ReLU and W_1; the residual path adds dr
        K.project(p.W_2.T, dr, da, da, False)              # da = dr W_2^T               (d_ff, N)
        K.relu_backward(da, acts.a[i], g.b_1)
        K.gram(acts.h1[i], da, g.W_1)                      # dW_1 = h1^T da
        K.project(p.W_1.T, da, dr, dh1, True)              # dh1 = dr + da W_1^T
        # 4'. through LN1; dr is now the gradient of h + ctx W_O + b_O
        K.layernorm_backward(dh1, acts.xhat1[i], acts.rstd1[i], p.ln1_g, dr, g.ln1_g, g.ln1_b)
        K.row_sums(dr, g.b_O)
        K.gram(acts.ctx[i], dr, g.W_O)                     # dW_O = ctx^T dr
        K.project(p.W_O.T, dr, dctx, dctx, False)          # dctx = dr W_O^T
        # 3'. the attention core                                                  dqkv: (3d, N)
        K.attention_backward(acts.qkv[i], acts.P[i], dctx, dqkv)
        # 2'. the packed projection; the residual path adds dr
        K.row_sums(dqkv, db_qkv)
        K.gram(acts.x[i], dqkv, dW_qkv)                    # [dW_Q | dW_K | dW_V] = h^T [dq dk dv]
        for c in range(d):
            g.b_Q[c], g.b_K[c], g.b_V[c] = db_qkv[c], db_qkv[d + c], db_qkv[2 * d + c]
            for r in range(d):
                g.W_Q[r, c], g.W_K[r, c], g.W_V[r, c] = dW_qkv[r, c], dW_qkv[r, d + c], dW_qkv[r, 2 * d + c]
        K.project(Wqkv[i].T, dqkv, dr, dh, True)           # dh = dr + [dq dk dv] [W_Q|W_K|W_V]^T
    # 1'. embeddings and (learned) positions
    d_embed = _mat(grads, lay.top[EMBED], lay.vocab_size, d)
    d_embed[:, :] = 0.0
    if lay.learned_positions:
        d_pos = _mat(grads, lay.top[POS], lay.seq_len, d)
    else:
        d_pos = np.empty((T, d), dt)
    d_pos[:, :] = 0.0
    K.embed_backward(tokens, dh, d_embed, d_pos)
    return loss, hits


# ----------------------------------------------------------------------------------------------
# whole batches
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
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


@njit(**_jit)
def run(mode, flat, lay, tokens, labels, pe, eps, grads, adam, out):
    """The one compiled entry point: the encoder on a batch, chunk by chunk, then by ``mode``

    - ``FORWARD``: the logits into ``out = (logits (B, C), attn, hidden, pooled)``, and when they
      are not empty the attention weights ``attn`` (L, B, H, T, T), the encoder's output ``hidden``
      (B, T, d) and its mean over positions ``pooled`` (B, d); returns ``(0.0, 0)``;
    - ``GRADIENT``: the backward pass too, the gradient of the batch's mean loss into ``grads``;
      returns the mean cross-entropy and the number of arg-max hits;
    - ``STEP``: then Adam, ``adam = (m, v, lr, beta1, beta2, eps, t)``, updates ``flat`` in place.

    Each chunk's gradient goes to a buffer of its own; they are added in chunk order.
    """
    B, T = tokens.shape
    L, d, H = lay.layers.shape[0], lay.d_model, lay.n_heads
    logits, attn, hidden, pooled = out
    lanes = simd.lanes_of(flat)
    n_chunks = (B + CHUNK - 1) // CHUNK
    Wqkv, bqkv = packed_qkv(flat, lay)
    partial = np.empty((n_chunks if mode != FORWARD else 0, flat.size), flat.dtype)
    losses = np.zeros(n_chunks)
    hits = np.zeros(n_chunks, np.int64)
    for ci in range(n_chunks):
        b0, b1 = ci * CHUNK, min(B, (ci + 1) * CHUNK)
        chunk = padded_chunk(tokens, b0, b1, flat)
        Bp = chunk.shape[0]
        acts = new_activations(lay, T, Bp, flat)
        forward_chunk(flat, lay, Wqkv, bqkv, chunk, pe, eps, acts)
        if mode != FORWARD:
            losses[ci], hits[ci] = backward_chunk(flat, partial[ci], lay, Wqkv, chunk, labels[b0:b1], B, acts)
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
                        hidden[b0 + b, t, c] = acts.x[L, c, K.column(b, t, T, lanes)]
                for i in range(L):
                    for h in range(H):
                        for q in range(T):
                            for k in range(T):
                                attn[i, b0 + b, h, q, k] = acts.P[i, h, vec, q, k, lane]
    if mode == FORWARD:
        return 0.0, 0
    # the chunks' gradients, losses and hits, added in chunk order
    grads[:] = partial[0]
    loss, hit = losses[0], hits[0]
    for ci in range(1, n_chunks):
        grads += partial[ci]
        loss += losses[ci]
        hit += hits[ci]
    if mode == STEP:
        moment1, moment2, lr, beta1, beta2, adam_eps, t = adam
        K.adam_update(flat, grads, moment1, moment2, lr, beta1, beta2, adam_eps, t)
    return loss / B, hit
