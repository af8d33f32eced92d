"""The tiny encoder, compiled: a forward pass, or a whole training step (forward, hand-written
backward and Adam), is one call into Numba.

    loss, hits = run(STEP, flat, layout, tokens, labels, pe, ln_eps, grads, adam, out)

(``core.models.encoder`` makes these calls: ``forward``, ``loss_and_grads``, ``train_step``.) At this size
(a 64 x 16 batch, d_model 32, two layers) the arithmetic of a step takes about a millisecond; a
step made of dozens of separate calls (NumPy products, small kernels, their allocations) spent
most of its time between them.

Part A is the step, numbered like the forward pass it mirrors; part B the kernels it calls; part C
the decoder's loss and gradient (``core.models.decoder_step``), made of the same sublayers plus
causal masks and cross-attention. They live in one file on purpose: Numba's on-disk cache keys a
compiled function on its own file only, so a step in another file would keep running the old
machine code of kernels edited here.

Parameters live in one flat buffer (``core.models.encoder.pack``, in ``core.models.encoder.param_shapes``
order) and are read through a :data:`Layout`: the sizes and the offset of every array. Gradients
go to a buffer of the same layout.

Determinism: the batch is cut into fixed chunks of :data:`CHUNK` sequences. Each chunk runs forward
and backward into its own gradient buffer, and the buffers are added in chunk order. The matrix
products are our own (:func:`project`, :func:`gram`), not a BLAS: no thread pool, so the result
depends on the inputs alone, bit for bit: not on the number of threads, on other work in the
process, or on timing. They are register tiles, as in a BLAS kernel (see
``core/kernels/tuned/simd.py``): twelve running sums stay in SIMD registers while a loop over the
shared axis feeds them; written as plain loops the sums go back to memory at every step, which ran
the products 2-3x slower.

Layout: activations are stored transposed, one row per feature and one column per token:
``(features, N)`` with ``N = T * Bp`` for a chunk of ``Bp`` sequences (padded to whole SIMD
vectors), the columns ordered by :func:`column`. So every loop over tokens (layer norms, biases,
ReLU) runs along a contiguous row, and in the attention one SIMD vector holds one position of
several sequences. Every kernel writes into arrays its caller passes.

No full ``fastmath``: the softmax relies on ``exp`` and comparisons behaving exactly. ``REDUCE``
lets LLVM reassociate sums (so they vectorise) and fuse multiply-adds; it changes roundings, never
how NaN or infinity behave. ``nogil``: two Streamlit sessions training at once run side by side.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from llvmlite import ir
from numba import njit
from numba.extending import intrinsic

from core.kernels.tuned import simd
from core.kernels.tuned.fastexp import fast_exp

REDUCE = {"reassoc", "contract"}
# error_model="numpy": a float division by zero gives inf as in IEEE arithmetic, not Python's
# ZeroDivisionError, whose check in every division keeps a loop out of SIMD lanes.
_jit = dict(cache=True, nogil=True, error_model="numpy")
_jit_reduce = dict(_jit, fastmath=REDUCE)


# ==============================================================================================
# A. the step
# ==============================================================================================
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


# ----------------------------------------------------------------------------------------------
# A1. parameters and activations
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
# A2. forward and backward of one chunk
# ----------------------------------------------------------------------------------------------
@njit(inline="always", **_jit)
def forward_chunk(flat, lay, Wqkv, bqkv, tokens, pe, eps, acts):
    """The encoder on a chunk's ``tokens`` (Bp, T), everything kept in ``acts``; ``pe`` (>= T, d)."""
    L, d = lay.layers.shape[0], lay.d_model
    # 1. h = embed[tokens] + PE                                                   x[0]: (d, N)
    embed_forward(tokens, _mat(flat, lay.top[EMBED], lay.vocab_size, d), pe, acts.x[0])
    # 2.-6. the layers                                                            x[L]: (d, N)
    encoder_layers(flat, lay, Wqkv, bqkv, eps, acts)
    # 7. logits = mean over positions of h, then W_cls and b_cls       pooled: (d, Bp), logits: (Bp, C)
    mean_pool(acts.x[L], tokens.shape[1], acts.pooled)
    classify(acts.pooled, _mat(flat, lay.top[W_CLS], d, lay.n_classes),
               flat[lay.top[B_CLS]:lay.top[B_CLS] + lay.n_classes], acts.logits)


@njit(**_jit)
def encoder_layers(flat, lay, Wqkv, bqkv, eps, acts):
    """Every layer, from ``acts.x[0]`` to ``acts.x[L]``, keeping what the backward pass needs."""
    sub = np.empty_like(acts.x[0])                 # a sublayer's output, before residual and norm
    for i in range(lay.layers.shape[0]):
        p = layer_views(flat, lay, i)
        self_attention(p, Wqkv[i], bqkv[i], acts.x[i], False, eps, acts.qkv[i], acts.P[i], acts.ctx[i],
                       sub, acts.h1[i], acts.xhat1[i], acts.rstd1[i])
        feed_forward(p, acts.h1[i], eps, acts.a[i], sub, acts.x[i + 1], acts.xhat2[i], acts.rstd2[i])


@njit(**_jit)
def self_attention(p, Wqkv, bqkv, x, causal, eps, qkv, P, ctx, sub, h1, xhat1, rstd1):
    """The attention sublayer, steps 2-4: ``h1 = LN1(x + MHA(x) + b_O)`` for ``x`` (d, N)."""
    d = x.shape[0]
    # 2. [q; k; v] = (x [W_Q | W_K | W_V] + [b_Q | b_K | b_V])^T                  qkv: (3d, N)
    project(Wqkv, x, qkv, qkv, False)
    add_bias(qkv, bqkv)
    # 3. every head: P = softmax(q k^T / sqrt(d_k)), its output P v   P: (H, Bv, T, T, lanes), ctx: (d, N)
    attention_forward(qkv, 0, qkv, d, 2 * d, causal, P, ctx)
    # 4. h1 = LN1(x + ctx W_O + b_O)                                                h1: (d, N)
    project(p.W_O, ctx, sub, sub, False)
    residual_layernorm(x, sub, p.b_O, p.ln1_g, p.ln1_b, eps, h1, xhat1, rstd1)


@njit(**_jit)
def feed_forward(p, h1, eps, a, sub, y, xhat2, rstd2):
    """The feed-forward sublayer, steps 5-6: ``y = LN2(h1 + relu(h1 W_1 + b_1) W_2 + b_2)``;
    with ``d_ff = 0`` (an attention-only model) there is none: ``y = h1``."""
    if a.shape[0] == 0:
        y[:, :] = h1
        return
    # 5. a = relu(h1 W_1 + b_1)                                                     a: (d_ff, N)
    project(p.W_1, h1, a, a, False)
    bias_relu(a, p.b_1)
    # 6. y = LN2(h1 + a W_2 + b_2), the next layer's input                          y: (d, N)
    project(p.W_2, a, sub, sub, False)
    residual_layernorm(h1, sub, p.b_2, p.ln2_g, p.ln2_b, eps, y, xhat2, rstd2)


@njit(inline="always", **_jit)
def backward_chunk(flat, grads, lay, Wqkv, tokens, labels, batch, acts):
    """Cross-entropy of the chunk (summed over its ``len(labels)`` real sequences, in float64) and
    the number of hits; writes the chunk's share of the gradient of the mean loss over ``batch``
    sequences into ``grads`` (every entry)."""
    Bp, T = tokens.shape
    d, C, N = lay.d_model, lay.n_classes, T * Bp
    dt = flat.dtype
    dh = np.empty((d, N), dt)            # gradient of a layer's output (of x[i+1])
    dlogits = np.empty((Bp, C), dt)
    # 7'. loss, classifier and the mean over positions
    loss, hits = cross_entropy(acts.logits, labels, 1.0 / batch, dlogits)       # padding rows: 0
    classify_backward(acts.pooled, _mat(flat, lay.top[W_CLS], d, C), dlogits, T,
                        _mat(grads, lay.top[W_CLS], d, C), grads[lay.top[B_CLS]:lay.top[B_CLS] + C], dh)
    # 6'.-2'. the layers, last first
    encoder_layers_backward(flat, grads, lay, Wqkv, acts, dh)
    # 1'. embeddings and (learned) positions
    d_embed = _mat(grads, lay.top[EMBED], lay.vocab_size, d)
    if lay.learned_positions:
        d_pos = _mat(grads, lay.top[POS], lay.seq_len, d)
    else:
        d_pos = np.empty((T, d), dt)
    embed_backward(tokens, dh, d_embed, d_pos)
    return loss, hits


@njit(**_jit)
def encoder_layers_backward(flat, grads, lay, Wqkv, acts, dh):
    """Backward of :func:`encoder_layers`: ``dh`` (d, N) arrives as the gradient of ``x[L]`` and
    leaves as that of ``x[0]``; the layers' gradients go to ``grads``."""
    d, F, N = lay.d_model, lay.d_ff, dh.shape[1]
    dt = flat.dtype
    dr, dh1, dctx = np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt)
    da, dqkv = np.empty((F, N), dt), np.empty((3 * d, N), dt)
    dW_qkv, db_qkv = np.empty((d, 3 * d), dt), np.empty(3 * d, dt)
    for i in range(lay.layers.shape[0] - 1, -1, -1):
        p, g = layer_views(flat, lay, i), layer_views(grads, lay, i)
        feed_forward_backward(p, g, dh, acts.xhat2[i], acts.rstd2[i], acts.a[i], acts.h1[i], dr, da, dh1)
        self_attention_backward(p, g, Wqkv[i], dh1, acts.xhat1[i], acts.rstd1[i], acts.x[i], acts.qkv[i],
                                acts.P[i], acts.ctx[i], dr, dctx, dqkv, dW_qkv, db_qkv, dh)


@njit(**_jit)
def feed_forward_backward(p, g, dy, xhat2, rstd2, a, h1, dr, da, dh1):
    """Backward of :func:`feed_forward`: ``dh1`` from ``dy``; ``dr`` and ``da`` are scratch."""
    if a.shape[0] == 0:
        dh1[:, :] = dy
        return
    # 6'. through LN2; dr is the gradient of h1 + a W_2 + b_2
    layernorm_backward(dy, xhat2, rstd2, p.ln2_g, dr, g.ln2_g, g.ln2_b)
    row_sums(dr, g.b_2)
    gram(a, dr, g.W_2)                               # dW_2 = a^T dr
    # 5'. through W_2, the ReLU and W_1; the residual path adds dr
    project(p.W_2.T, dr, da, da, False)              # da = dr W_2^T               (d_ff, N)
    relu_backward(da, a, g.b_1)
    gram(h1, da, g.W_1)                              # dW_1 = h1^T da
    project(p.W_1.T, da, dr, dh1, True)              # dh1 = dr + da W_1^T


@njit(**_jit)
def self_attention_backward(p, g, Wqkv, dh1, xhat1, rstd1, x, qkv, P, ctx, dr, dctx, dqkv, dW_qkv, db_qkv, dx):
    """Backward of :func:`self_attention`: ``dx`` from ``dh1``; the rest after ``ctx`` is scratch."""
    d = x.shape[0]
    # 4'. through LN1; dr is the gradient of x + ctx W_O + b_O
    layernorm_backward(dh1, xhat1, rstd1, p.ln1_g, dr, g.ln1_g, g.ln1_b)
    row_sums(dr, g.b_O)
    gram(ctx, dr, g.W_O)                             # dW_O = ctx^T dr
    project(p.W_O.T, dr, dctx, dctx, False)          # dctx = dr W_O^T
    # 3'. the attention core                                                      dqkv: (3d, N)
    attention_backward(qkv, 0, qkv, d, 2 * d, P, dctx, dqkv, dqkv)
    # 2'. the packed projection; the residual path adds dr
    row_sums(dqkv, db_qkv)
    gram(x, dqkv, dW_qkv)                            # [dW_Q | dW_K | dW_V] = x^T [dq dk dv]
    for c in range(d):
        g.b_Q[c], g.b_K[c], g.b_V[c] = db_qkv[c], db_qkv[d + c], db_qkv[2 * d + c]
        for r in range(d):
            g.W_Q[r, c], g.W_K[r, c], g.W_V[r, c] = dW_qkv[r, c], dW_qkv[r, d + c], dW_qkv[r, 2 * d + c]
    project(Wqkv.T, dqkv, dr, dx, True)              # dx = dr + [dq dk dv] [W_Q|W_K|W_V]^T


# ----------------------------------------------------------------------------------------------
# A3. whole batches: the one compiled entry point
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
                        hidden[b0 + b, t, c] = acts.x[L, c, column(b, t, T, lanes)]
                for i in range(L):
                    for h in range(H):
                        for q in range(T):
                            for k in range(T):
                                attn[i, b0 + b, h, q, k] = acts.P[i, h, vec, q, k, lane]
    if mode == FORWARD:
        return 0.0, 0
    # the chunks' gradients, losses and hits, added in chunk order
    add_in_order(partial, grads)
    loss, hit = losses[0], hits[0]
    for ci in range(1, n_chunks):
        loss += losses[ci]
        hit += hits[ci]
    if mode == STEP:
        moment1, moment2, lr, beta1, beta2, adam_eps, t = adam
        adam_update(flat, grads, moment1, moment2, lr, beta1, beta2, adam_eps, t)
    return loss / B, hit


@njit(**_jit)
def add_in_order(partial, out):
    """``out = partial[0] + partial[1] + ...``, added in that order: the same bits however the
    chunks were computed."""
    for n in range(out.shape[0]):
        total = partial[0, n]
        for ci in range(1, partial.shape[0]):
            total += partial[ci, n]
        out[n] = total


# ==============================================================================================
# B. the kernels
# ==============================================================================================
# ----------------------------------------------------------------------------------------------
# B1. matrix products (register tiles: 4 output rows by 3 SIMD vectors)
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
def _tile_starts(n, width, i):
    """Start of tile ``i`` of ``width`` along an axis of length ``n >= width``: the last tile is
    moved back to end at ``n``, so it may overlap the one before (its results are recomputed
    exactly, in the same order, so overlapping writes agree)."""
    return min(i * width, n - width)


@njit(inline="always", **_jit)
def _project_tile(A, x, y0, y, K, N, m, n, add):
    """``Y[m:m+4, n:n+3 lanes] = (Y0 block if add) + sum_k A[k, m+r] X[k, n:n+3 lanes]``.

    ``x``, ``y0``, ``y`` are the flat (row-major) ``X``, ``Y0``, ``Y``. Each step of ``k`` loads
    three vectors of ``X``'s row k, broadcasts four numbers of ``A`` and does twelve fused
    multiply-adds into the running sums.
    """
    L = simd.lanes_of(x)
    if add:
        o = m * N + n
        a00, a01, a02 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += N
        a10, a11, a12 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += N
        a20, a21, a22 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
        o += N
        a30, a31, a32 = simd.load(y0, o), simd.load(y0, o + L), simd.load(y0, o + 2 * L)
    else:
        a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = simd.zeros(x)
    for k in range(K):
        i = k * N + n
        u0, u1, u2 = simd.load(x, i), simd.load(x, i + L), simd.load(x, i + 2 * L)
        w = simd.splat(A[k, m], x)
        a00, a01, a02 = simd.fma(w, u0, a00), simd.fma(w, u1, a01), simd.fma(w, u2, a02)
        w = simd.splat(A[k, m + 1], x)
        a10, a11, a12 = simd.fma(w, u0, a10), simd.fma(w, u1, a11), simd.fma(w, u2, a12)
        w = simd.splat(A[k, m + 2], x)
        a20, a21, a22 = simd.fma(w, u0, a20), simd.fma(w, u1, a21), simd.fma(w, u2, a22)
        w = simd.splat(A[k, m + 3], x)
        a30, a31, a32 = simd.fma(w, u0, a30), simd.fma(w, u1, a31), simd.fma(w, u2, a32)
    o = m * N + n
    simd.store(y, o, a00), simd.store(y, o + L, a01), simd.store(y, o + 2 * L, a02)
    o += N
    simd.store(y, o, a10), simd.store(y, o + L, a11), simd.store(y, o + 2 * L, a12)
    o += N
    simd.store(y, o, a20), simd.store(y, o + L, a21), simd.store(y, o + 2 * L, a22)
    o += N
    simd.store(y, o, a30), simd.store(y, o + L, a31), simd.store(y, o + 2 * L, a32)


@njit(**_jit)
def project(A, X, Y0, Y, add):
    """``Y = A^T X`` (``add`` False) or ``Y = Y0 + A^T X`` (``add`` True): ``Y[m] = sum_k A[k, m] X[k]``.

    ``A`` (K, M), any layout: a weight ``W`` (d_in, d_out) for the forward ``(h W)^T = W^T h^T``,
    or its transpose ``W.T`` for the backward ``(dy W^T)^T = W dy^T``. ``X`` (K, N), ``Y0`` and
    ``Y`` (M, N) C-contiguous; ``Y0`` must not be ``Y`` (tiles may be computed twice; ignored
    when ``add`` is False).
    """
    K, M = A.shape
    N = X.shape[1]
    W = 3 * simd.lanes_of(X)
    if M < 4 or N < W:
        _project_plain(A, X, Y0, Y, add)
        return
    x, y0, y = X.ravel(), Y0.ravel(), Y.ravel()
    # columns outer: a tile's rows of X (K by 3 vectors) stay in the L1 cache for every row block
    for tn in range((N + W - 1) // W):
        n = _tile_starts(N, W, tn)
        for tm in range((M + 3) // 4):
            _project_tile(A, x, y0, y, K, N, _tile_starts(M, 4, tm), n, add)


@njit(**_jit)
def _project_plain(A, X, Y0, Y, add):
    """:func:`project` as plain loops, for shapes smaller than one tile."""
    K, M = A.shape
    N = X.shape[1]
    for m in range(M):
        for n in range(N):
            Y[m, n] = Y0[m, n] if add else 0.0
        for k in range(K):
            a = A[k, m]
            for n in range(N):
                Y[m, n] += a * X[k, n]


@intrinsic
def _lane_sum(typingctx, v):
    """The sum of a vector's lanes, as a tree of adds (half the lanes onto the other half, and
    again): a fixed order, so the same bits every time."""
    if not isinstance(v, simd.Vector):
        return None

    def codegen(context, builder, signature, args):
        x, n = args[0], v.lanes
        while n > 1:
            n //= 2
            low = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n))))
            high = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n, 2 * n))))
            x = builder.fadd(low, high)
        return builder.extract_element(x, ir.Constant(ir.IntType(32), 0))

    return v.dtype(v), codegen


@njit(inline="always", **_jit)
def _gram_tile(x, g, N, NV, k, m, out):
    """``out[k:k+4, m:m+3] = sum_n X[k+r, n] G[m+s, n]`` over the whole rows: twelve vectors of
    running sums over the first ``NV`` columns (whole vectors), then each one's lanes and the
    last ``N - NV`` columns added in order."""
    L = simd.lanes_of(x)
    a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = a30 = a31 = a32 = simd.zeros(x)
    r0, r1, r2, r3, s0, s1, s2 = k * N, (k + 1) * N, (k + 2) * N, (k + 3) * N, m * N, (m + 1) * N, (m + 2) * N
    for n in range(0, NV, L):
        x0, x1, x2, x3 = simd.load(x, r0 + n), simd.load(x, r1 + n), simd.load(x, r2 + n), simd.load(x, r3 + n)
        g0, g1, g2 = simd.load(g, s0 + n), simd.load(g, s1 + n), simd.load(g, s2 + n)
        a00, a01, a02 = simd.fma(x0, g0, a00), simd.fma(x0, g1, a01), simd.fma(x0, g2, a02)
        a10, a11, a12 = simd.fma(x1, g0, a10), simd.fma(x1, g1, a11), simd.fma(x1, g2, a12)
        a20, a21, a22 = simd.fma(x2, g0, a20), simd.fma(x2, g1, a21), simd.fma(x2, g2, a22)
        a30, a31, a32 = simd.fma(x3, g0, a30), simd.fma(x3, g1, a31), simd.fma(x3, g2, a32)
    sums = ((a00, a01, a02), (a10, a11, a12), (a20, a21, a22), (a30, a31, a32))
    for r in range(4):
        for s in range(3):
            total = _lane_sum(sums[r][s])
            for n in range(NV, N):
                total += x[(k + r) * N + n] * g[(m + s) * N + n]
            out[k + r, m + s] = total


@njit(**_jit)
def gram(X, G, out):
    """``out = X G^T``: ``out[k, m] = sum_n X[k, n] G[m, n]`` (a weight's gradient, ``h^T dy``).

    ``X`` (K, N) and ``G`` (M, N) C-contiguous; ``out`` (K, M) is overwritten.
    """
    K, N = X.shape
    M = G.shape[0]
    if K < 4 or M < 3:
        for k in range(K):
            for m in range(M):
                total = X[k, 0] * G[m, 0]
                for n in range(1, N):
                    total += X[k, n] * G[m, n]
                out[k, m] = total
        return
    L = simd.lanes_of(X)
    x, g = X.ravel(), G.ravel()
    NV = N - N % L
    for tk in range((K + 3) // 4):
        for tm in range((M + 2) // 3):
            _gram_tile(x, g, N, NV, _tile_starts(K, 4, tk), _tile_starts(M, 3, tm), out)


# ----------------------------------------------------------------------------------------------
# B2. elementwise steps over (features, N) rows
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
def add_bias(Y, bias):
    """In place: ``Y[m] += bias[m]``."""
    M, N = Y.shape
    for m in range(M):
        b = bias[m]
        for n in range(N):
            Y[m, n] += b


@njit(**_jit_reduce)
def row_sums(Y, out):
    """``out[m] = sum_n Y[m, n]`` (a bias's gradient)."""
    M, N = Y.shape
    for m in range(M):
        total = Y[m, 0]
        for n in range(1, N):
            total += Y[m, n]
        out[m] = total


@njit(**_jit)
def bias_relu(Z, bias):
    """In place: ``Z = max(Z + bias, 0)``, row ``m`` getting ``bias[m]``."""
    M, N = Z.shape
    zero = Z.dtype.type(0)
    for m in range(M):
        b = bias[m]
        for n in range(N):
            v = Z[m, n] + b
            Z[m, n] = v if v > zero else zero


@njit(**_jit_reduce)
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


@njit(**_jit)
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


@njit(**_jit_reduce)
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


# ----------------------------------------------------------------------------------------------
# B3. multi-head attention core (between the packed QKV projection and W_O)
# ----------------------------------------------------------------------------------------------
# A SIMD vector holds one position of `lanes` sequences (the chunk's sequences are padded to whole
# vectors), so the attention of all of them runs at once; columns are ordered so that one vector
# of sequences has its own T x lanes columns (:func:`column`), and its attention (Q, K, V, weights,
# about 20 kB at T = 16) stays in the L1 cache. Loops over the lanes, written as plain loops, are
# one vector long: LLVM's set-up for each (alias checks, the tail) would cost more than the
# arithmetic, so these kernels use the vectors directly.
@intrinsic
def _maximum(typingctx, a, b):
    """``a if a > b else b`` lane by lane (a NaN in ``a`` keeps ``b``)."""
    if not (isinstance(a, simd.Vector) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])

    return a(a, b), codegen


@njit(**_jit)
def _mul(a, b, like):
    """``a * b`` lane by lane (one rounding, as ``fma(a, b, 0)``)."""
    return simd.fma(a, b, simd.zeros(like))


@njit(inline="always", **_jit)
def _dot8(w, wo, ws, y, yo, yr, yt, n, like):
    """Eight sums of products of vectors, for r = 0..7: ``sum_{t < n} w[wo + t ws] * y[yo + r yr + t yt]``.

    Eight independent chains of fused multiply-adds sharing each load of ``w``: a chain alone
    waits on its own latency at every step, and eight keep both of the core's FMA units busy.
    """
    o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = simd.zeros(like)
    for t in range(n):
        u, at = simd.load(w, wo + t * ws), yo + t * yt
        o0 = simd.fma(u, simd.load(y, at), o0)
        o1 = simd.fma(u, simd.load(y, at + yr), o1)
        o2 = simd.fma(u, simd.load(y, at + 2 * yr), o2)
        o3 = simd.fma(u, simd.load(y, at + 3 * yr), o3)
        o4 = simd.fma(u, simd.load(y, at + 4 * yr), o4)
        o5 = simd.fma(u, simd.load(y, at + 5 * yr), o5)
        o6 = simd.fma(u, simd.load(y, at + 6 * yr), o6)
        o7 = simd.fma(u, simd.load(y, at + 7 * yr), o7)
    return o0, o1, o2, o3, o4, o5, o6, o7


@njit(inline="always", **_jit)
def _dot1(w, wo, ws, y, yo, yt, n, like):
    """:func:`_dot8` for one r: ``sum_{t < n} w[wo + t ws] * y[yo + t yt]``."""
    o = simd.zeros(like)
    for t in range(n):
        o = simd.fma(simd.load(w, wo + t * ws), simd.load(y, yo + t * yt), o)
    return o


@njit(inline="always", **_jit)
def _dots_into(out, oo, orr, w, wo, ws, y, yo, yr, yt, n, m, like):
    """``out[oo + r orr] = sum_{t < n} w[wo + t ws] * y[yo + r yr + t yt]`` for r = 0..m-1 (vectors),
    eight at a time."""
    r = 0
    while r + 8 <= m:
        o0, o1, o2, o3, o4, o5, o6, o7 = _dot8(w, wo, ws, y, yo + r * yr, yr, yt, n, like)
        at = oo + r * orr
        simd.store(out, at, o0), simd.store(out, at + orr, o1)
        simd.store(out, at + 2 * orr, o2), simd.store(out, at + 3 * orr, o3)
        simd.store(out, at + 4 * orr, o4), simd.store(out, at + 5 * orr, o5)
        simd.store(out, at + 6 * orr, o6), simd.store(out, at + 7 * orr, o7)
        r += 8
    while r < m:
        simd.store(out, oo + r * orr, _dot1(w, wo, ws, y, yo + r * yr, yt, n, like))
        r += 1


@njit(**_jit)
def attention_forward(xq, q_row, xkv, k_row, v_row, causal, P, ctx):
    """Per-head scaled dot-product attention on a chunk, a vector of sequences at a time.

    Queries are rows ``q_row:q_row+d`` of ``xq`` (rows, Nq); keys and values rows ``k_row:k_row+d``
    and ``v_row:v_row+d`` of ``xkv`` (rows, Nk), biases included, columns in :func:`column` order
    (Nq = Tq Bp, Nk = Tk Bp). Self-attention passes the packed ``qkv`` (3d, N) twice, with rows 0,
    d and 2d; cross-attention the decoder's queries and the encoder's keys and values. Writes
    ``P`` (H, Bv, Tq, Tk, lanes), ``P[h, v, i, j, l] = softmax_j(q_i . k_j / sqrt(d_k))`` of sequence
    ``v lanes + l`` (``causal``: keys ``j > i`` get weight exactly 0), and the heads' outputs,
    concatenated, ``ctx`` (d, Nq): ``ctx[h d_k + c, (i)] = sum_j P[h, i, j] v_j[c]``.
    """
    H, Bv, Tq, Tk = P.shape[0], P.shape[1], P.shape[2], P.shape[3]
    Nq, Nk = xq.shape[1], xkv.shape[1]
    dk = ctx.shape[0] // H
    L = simd.lanes_of(xq)
    TL = Tk * L                                  # one query's block of P
    x, y, p, out = xq.ravel(), xkv.ravel(), P.ravel(), ctx.ravel()
    scale = simd.splat(1.0 / math.sqrt(dk), xq)
    minus_one = simd.splat(-1.0, xq)
    masked = simd.splat(-np.inf, xq)
    lanes = np.empty(L, xq.dtype)
    for h in range(H):
        for v in range(Bv):
            # this head's Q, K, V rows and output rows, at this vector's columns; its block of P
            q0 = (q_row + h * dk) * Nq + v * Tq * L
            k0, v0 = (k_row + h * dk) * Nk + v * TL, (v_row + h * dk) * Nk + v * TL
            o0 = h * dk * Nq + v * Tq * L
            block = (h * Bv + v) * Tq * TL
            for i in range(Tq):
                row = block + i * TL                                     # P[h, v, i]: (Tk, lanes)
                live = min(i + 1, Tk) if causal else Tk                  # keys this query may see
                # 1. scores s_j = q_i . k_j / sqrt(d_k) of every visible key j, minus their maximum
                _dots_into(p, row, L, x, q0 + i * L, Nq, y, k0, L, Nk, dk, live, xq)
                top = simd.splat(-np.inf, xq)
                for j in range(live):
                    s = _mul(simd.load(p, row + j * L), scale, xq)
                    simd.store(p, row + j * L, s)
                    top = _maximum(s, top)
                shift = _mul(top, minus_one, xq)
                for j in range(live):
                    simd.store(p, row + j * L, simd.add(simd.load(p, row + j * L), shift))
                for j in range(live, Tk):
                    simd.store(p, row + j * L, masked)                   # exp(-inf) = 0 exactly
            # 2. exponentials of the whole block, every query at once (one long loop from 0 over a
            # slice, which LLVM vectorises; a loop per query spent a third of its time starting)
            weights = p[block:block + Tq * TL]
            for n in range(Tq * TL):
                weights[n] = fast_exp(weights[n])
            for i in range(Tq):
                row = block + i * TL
                # 3. divide by the sum over the keys
                total = simd.zeros(xq)
                for j in range(Tk):
                    total = simd.add(total, simd.load(p, row + j * L))
                simd.store(lanes, 0, total)
                for lane in range(L):
                    lanes[lane] = 1.0 / lanes[lane]
                inverse = simd.load(lanes, 0)
                for j in range(Tk):
                    simd.store(p, row + j * L, _mul(simd.load(p, row + j * L), inverse, xq))
                # 4. the head's output for query i: o_c = sum_j P_ij v_j[c]
                _dots_into(out, o0 + i * L, Nq, p, row, L, y, v0, Nk, L, Tk, dk, xq)


@njit(**_jit)
def attention_backward(xq, q_row, xkv, k_row, v_row, P, dctx, dxq, dxkv):
    """Backward of :func:`attention_forward`: the gradients of the queries into rows
    ``q_row:q_row+d`` of ``dxq``, of the keys and values into rows ``k_row:``, ``v_row:`` of
    ``dxkv`` (laid out as ``xq`` and ``xkv``; self-attention passes ``dqkv`` twice), overwritten.

    With ``S = Q K^T / sqrt(d_k)``, ``P = softmax(S)``, ``O = P V``: ``dP = dO V^T``,
    ``dS = P * (dP - rowsum(dP * P))``, then ``dQ = dS K / sqrt(d_k)``, ``dK = dS^T Q / sqrt(d_k)``,
    ``dV = P^T dO``. Each output is one sum per entry (no read-modify-write). A causal mask needs
    nothing here: its weights are 0, so are their ``dS``.
    """
    H, Bv, Tq, Tk = P.shape[0], P.shape[1], P.shape[2], P.shape[3]
    Nq, Nk = xq.shape[1], xkv.shape[1]
    dk = dctx.shape[0] // H
    L = simd.lanes_of(xq)
    TL = Tk * L
    x, y, p, g, dx, dy = xq.ravel(), xkv.ravel(), P.ravel(), dctx.ravel(), dxq.ravel(), dxkv.ravel()
    scale = simd.splat(1.0 / math.sqrt(dk), xq)
    minus_one = simd.splat(-1.0, xq)
    dS = np.empty(Tq * TL, xq.dtype)                # dS of one (head, vector), laid out as its P block
    for h in range(H):
        for v in range(Bv):
            q0 = (q_row + h * dk) * Nq + v * Tq * L
            k0, v0 = (k_row + h * dk) * Nk + v * TL, (v_row + h * dk) * Nk + v * TL
            o0 = h * dk * Nq + v * Tq * L
            block = (h * Bv + v) * Tq * TL
            for i in range(Tq):
                row = i * TL
                # 1. dP_ij = dO_i . v_j
                _dots_into(dS, row, L, g, o0 + i * L, Nq, y, v0, L, Nk, dk, Tk, xq)
                # 2. through the softmax and the 1 / sqrt(d_k): dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij)
                rowdot = _dot1(p, block + row, L, dS, row, L, Tk, xq)
                minus_rowdot = _mul(rowdot, minus_one, xq)
                for j in range(Tk):
                    at = row + j * L
                    diff = simd.add(simd.load(dS, at), minus_rowdot)
                    simd.store(dS, at, _mul(_mul(simd.load(p, block + at), diff, xq), scale, xq))
            for job in range(3):
                # 3. dq_t = sum_j dS_tj k_j; 4. dk_t = sum_i dS_it q_i; 5. dv_t = sum_i P_it dO_i
                # (one call site: each copy of the inlined loops costs seconds of compile time)
                if job == 0:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dx, q0, Tq, Nq, dS, 0, L, y, k0, Nk, Tk
                elif job == 1:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dy, k0, Tk, Nk, dS, 0, TL, x, q0, Nq, Tq
                else:
                    d_out, out, n_out, N_out, w, wo, ws, src, so, sr, n = dy, v0, Tk, Nk, p, block, TL, g, o0, Nq, Tq
                for t in range(n_out):
                    # job 0 reads row t of dS (stride L over keys), jobs 1 and 2 column t (stride TL)
                    start = wo + (t * TL if job == 0 else t * L)
                    _dots_into(d_out, out + t * L, N_out, w, start, ws, src, so, sr, L, n, dk, xq)


# ----------------------------------------------------------------------------------------------
# B4. embedding, pooling, classifier and loss
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
def column(b, t, T, L):
    """The column of position ``t`` of sequence ``b`` in a chunk's activations: sequences are
    grouped by vectors of ``L`` (their lanes), each group holding its ``T x L`` columns
    position-major: ``((b // L) T + t) L + b % L``."""
    return ((b // L) * T + t) * L + b % L


@njit(**_jit)
def embed_forward(tokens, embed, pe, X):
    """``X[:, column(b, t)] = embed[tokens[b, t]] + pe[t]``: ``X`` (d, N), ``pe`` (T, d)."""
    Bp, T = tokens.shape
    d = embed.shape[1]
    L = simd.lanes_of(X)
    for b in range(Bp):
        for t in range(T):
            n, tok = column(b, t, T, L), tokens[b, t]
            for c in range(d):
                X[c, n] = embed[tok, c] + pe[t, c]


@njit(**_jit)
def embed_backward(tokens, dX, d_embed, d_pos):
    """Scatter-add the columns of ``dX`` (d, N) into ``d_embed`` (V, d) by token and ``d_pos``
    (at least T, d) by position; both are zeroed first."""
    Bp, T = tokens.shape
    d = dX.shape[0]
    L = simd.lanes_of(dX)
    for v in range(d_embed.shape[0]):
        for c in range(d):
            d_embed[v, c] = 0.0
    for t in range(d_pos.shape[0]):
        for c in range(d):
            d_pos[t, c] = 0.0
    for b in range(Bp):
        for t in range(T):
            n, tok = column(b, t, T, L), tokens[b, t]
            for c in range(d):
                d_embed[tok, c] += dX[c, n]
                d_pos[t, c] += dX[c, n]


@njit(**_jit)
def mean_pool(X, T, pooled):
    """``pooled[:, b] = mean_t X[:, column(b, t)]``: ``X`` (d, N), ``pooled`` (d, Bp)."""
    d, Bp = pooled.shape
    L = simd.lanes_of(X)
    for c in range(d):
        for b in range(Bp):
            total = X[c, column(b, 0, T, L)]
            for t in range(1, T):
                total += X[c, column(b, t, T, L)]
            pooled[c, b] = total / T


@njit(**_jit)
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


@njit(**_jit)
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


@njit(**_jit)
def classify_backward(pooled, W, dlogits, T, dW, dbias, dX):
    """Backward of :func:`classify` and :func:`mean_pool`: ``dW``, ``dbias`` overwritten, and
    every position of sequence b gets ``dpooled_b / T`` in ``dX`` (d, N), at :func:`column`."""
    d, Bp = pooled.shape
    C = W.shape[1]
    L = simd.lanes_of(dX)
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
            for t in range(T):
                dX[c, column(b, t, T, L)] = g


# ----------------------------------------------------------------------------------------------
# B5. optimiser
# ----------------------------------------------------------------------------------------------
@njit(**_jit)
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


# ==============================================================================================
# C. the decoder's gradient (core.models.decoder_step): the same kernels, in a decoder's order
# ==============================================================================================
# A decoder layer (core/models/decoder.py) is an encoder layer with a causal mask and, in an
# encoder-decoder, a cross-attention sublayer between its self-attention and its feed-forward:
#     x -> h1 = LN1(x + MHA(x, causal)) -> h2 = LN_cross(h1 + MHA(h1, over m)) -> LN2(h2 + FFN(h2))
# The encoder's output m (the "memory") gives the keys and values of every cross-attention.
CROSS_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "ln_g", "ln_b")
Cross = namedtuple("Cross", CROSS_PARAMS)
DecoderLayout = namedtuple("DecoderLayout", ["enc", "dec", "cross"])
DecoderLayout.__doc__ = """Where a decoder's parameters start in its flat buffer.

``enc``, ``dec``: a :data:`Layout` each, for the encoder's and the decoder's stacks (their
self-attention and feed-forward sublayers; ``dec.top`` holds ``W_out`` and ``b_out`` where an
encoder holds its classifier, ``dec.n_classes`` is the vocabulary); a decoder-only model's
``enc`` has no layers. ``cross`` (L, 10): each decoder layer's cross-attention arrays, in
``CROSS_PARAMS`` order (no rows without cross-attention). Sublayers a model lacks (the
feed-forward one when ``d_ff = 0``) have offset 0: their views are never read."""
# The cross-attention sublayers' activations, per decoder layer i: cq[i] (d, N) queries, ckv[i]
# (2d, Ns) keys and values of the memory, Pc[i] (H, Bv, T, S, lanes) weights, cctx[i] (d, N)
# heads' outputs, h2[i] (d, N) after LN_cross, xhatc[i] and rstdc[i] for that norm.
CrossActivations = namedtuple("CrossActivations", ["cq", "ckv", "Pc", "cctx", "h2", "xhatc", "rstdc"])


@njit(**_jit)
def cross_views(flat, lay, i):
    """Decoder layer ``i``'s cross-attention arrays as views of ``flat``."""
    d = lay.dec.d_model
    at = lay.cross[i]
    return Cross(_mat(flat, at[0], d, d), _mat(flat, at[1], d, d), _mat(flat, at[2], d, d),
                 _mat(flat, at[3], d, d), flat[at[4]:at[4] + d], flat[at[5]:at[5] + d],
                 flat[at[6]:at[6] + d], flat[at[7]:at[7] + d], flat[at[8]:at[8] + d], flat[at[9]:at[9] + d])


@njit(**_jit)
def packed_kv(flat, lay):
    """``[W_K | W_V]`` (L, d, 2d) and ``[b_K | b_V]`` (L, 2d) of every cross-attention: the memory's
    keys and values in one projection."""
    L, d = lay.cross.shape[0], lay.dec.d_model
    W = np.empty((L, d, 2 * d), flat.dtype)
    b = np.empty((L, 2 * d), flat.dtype)
    for i in range(L):
        c = cross_views(flat, lay, i)
        W[i, :, :d] = c.W_K
        W[i, :, d:] = c.W_V
        b[i, :d] = c.b_K
        b[i, d:] = c.b_V
    return W, b


@njit(**_jit)
def cross_attention(c, Wkv, bkv, h1, memory, eps, cq, ckv, Pc, cctx, sub, h2, xhatc, rstdc):
    """``h2 = LN_cross(h1 + MHA(queries from h1, keys and values from memory) + b_O)``."""
    d = h1.shape[0]
    project(c.W_Q, h1, cq, cq, False)                # q = (h1 W_Q + b_Q)^T              (d, N)
    add_bias(cq, c.b_Q)
    project(Wkv, memory, ckv, ckv, False)            # [k; v] = (m [W_K | W_V] + ...)^T (2d, Ns)
    add_bias(ckv, bkv)
    attention_forward(cq, 0, ckv, 0, d, False, Pc, cctx)
    project(c.W_O, cctx, sub, sub, False)
    residual_layernorm(h1, sub, c.b_O, c.ln_g, c.ln_b, eps, h2, xhatc, rstdc)


@njit(**_jit)
def cross_attention_backward(c, gc, Wkv, dh2, xhatc, rstdc, h1, memory, cq, ckv, Pc, cctx, dr, dcctx, dcq,
                             dckv, dW_kv, db_kv, scratch, dmemory, dh1):
    """Backward of :func:`cross_attention`: ``dh1`` from ``dh2``, and the memory's share added to
    ``dmemory`` (d, Ns); ``dr`` ... ``scratch`` are scratch."""
    d = h1.shape[0]
    layernorm_backward(dh2, xhatc, rstdc, c.ln_g, dr, gc.ln_g, gc.ln_b)
    row_sums(dr, gc.b_O)
    gram(cctx, dr, gc.W_O)                           # dW_O = cctx^T dr
    project(c.W_O.T, dr, dcctx, dcctx, False)
    attention_backward(cq, 0, ckv, 0, d, Pc, dcctx, dcq, dckv)
    row_sums(dcq, gc.b_Q)
    gram(h1, dcq, gc.W_Q)                            # dW_Q = h1^T dq
    project(c.W_Q.T, dcq, dr, dh1, True)             # dh1 = dr + dq W_Q^T (the residual path adds dr)
    row_sums(dckv, db_kv)
    gram(memory, dckv, dW_kv)                        # [dW_K | dW_V] = m^T [dk dv]
    gc.W_K[:, :] = dW_kv[:, :d]
    gc.W_V[:, :] = dW_kv[:, d:]
    gc.b_K[:] = db_kv[:d]
    gc.b_V[:] = db_kv[d:]
    project(Wkv.T, dckv, dmemory, scratch, True)     # dm += [dk dv] [W_K | W_V]^T
    dmemory[:, :] = scratch


@njit(**_jit)
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


@njit(**_jit)
def decoder_chunk(flat, grads, lay, packed, src, tgt_in, tgt_out, n_real, scale, pe_src, pe_tgt, eps):
    """Forward and backward on one chunk (sequences padded to whole vectors); the chunk's share of
    the gradient into ``grads`` (every entry). Returns its summed cross-entropy."""
    Wqkv_e, bqkv_e, Wqkv_d, bqkv_d, Wkv, bkv = packed
    enc, dec = lay.enc, lay.dec
    Bp, T = tgt_in.shape
    S = src.shape[1]
    L, d, H, V = dec.layers.shape[0], dec.d_model, dec.n_heads, dec.n_classes
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
    W_out = _mat(flat, dec.top[W_CLS], d, V)
    project(W_out, da.x[L], logits, logits, False)          # logits = (x W_out + b_out)^T    (V, N)
    add_bias(logits, flat[dec.top[B_CLS]:dec.top[B_CLS] + V])
    loss = token_cross_entropy(logits, tgt_out, n_real, scale, dlogits)
    # backward, the same steps in reverse
    dh = np.empty((d, N), dt)
    row_sums(dlogits, grads[dec.top[B_CLS]:dec.top[B_CLS] + V])
    gram(da.x[L], dlogits, _mat(grads, dec.top[W_CLS], d, V))
    project(W_out.T, dlogits, dh, dh, False)                 # dx = dlogits W_out^T
    F = dec.d_ff
    dr, dmid, dh1, dctx = np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt), np.empty((d, N), dt)
    d_a, dqkv = np.empty((F, N), dt), np.empty((3 * d, N), dt)
    dW_qkv, db_qkv = np.empty((d, 3 * d), dt), np.empty(3 * d, dt)
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
                                da.P[i], da.ctx[i], dr, dctx, dqkv, dW_qkv, db_qkv, dh)
    embed_backward(tgt_in, dh, _mat(grads, dec.top[EMBED], dec.vocab_size, d), _positions(grads, dec, T))
    if cross:
        encoder_layers_backward(flat, grads, enc, Wqkv_e, ea, dmemory)
        embed_backward(src, dmemory, _mat(grads, enc.top[EMBED], enc.vocab_size, d), _positions(grads, enc, S))
    return loss


@njit(**_jit)
def _positions(grads, lay, T):
    """Where the gradient of the positions goes: the learned table, or scratch."""
    if lay.learned_positions:
        return _mat(grads, lay.top[POS], lay.seq_len, lay.d_model)
    return np.empty((T, lay.d_model), grads.dtype)


@njit(**_jit)
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
