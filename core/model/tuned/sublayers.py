"""The compiled sublayers: where each parameter sits in the flat buffer, and the self-attention
and feed-forward sublayers with their backward passes, as the encoder and decoder steps call them.

Parameters live in one flat buffer (:func:`core.model.params.pack`, in
:func:`core.model.config.param_shapes` order) and are read through a :data:`Layout`: the sizes and
the offset of every array, built from the parameters' names by :mod:`core.model.tuned.offsets`.
Gradients go to a buffer of the same layout.

Layout of activations: stored transposed, one row per feature and one column per token:
``(features, N)`` with ``N = T * Bp`` for a chunk of ``Bp`` sequences (padded to whole SIMD
vectors), the columns ordered by :func:`core.model.tuned.embedding_and_loss.column`. Every kernel writes into
arrays its caller passes.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from core.model.tuned import JIT
from core.model.tuned.attention import attention_backward, attention_forward
from core.model.tuned.products import gram, project
from core.model.tuned.elementwise import (add_bias, bias_relu, layernorm_backward, relu_backward,
                                              residual_layernorm, row_sums)

# One block's arrays, in the order of the compiled kernels' slots (Layout.layers' columns), under
# their names in the one vocabulary (blocks.{i}.attn.W_Q ...). A Layer's fields are the same names
# with "_" for "." (p.attn_W_Q, p.ln1_g): a field's name cannot hold a dot.
LAYER_SLOTS = ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "attn.b_Q", "attn.b_K", "attn.b_V", "attn.b_O",
               "ln1.g", "ln1.b", "ln2.g", "ln2.b", "ffn.W_1", "ffn.b_1", "ffn.W_2", "ffn.b_2")
# Offsets of the arrays outside the blocks, in Layout.top: the output layer is the classifier
# (classifier.W, classifier.b) or the language model's unembedding (unembed, unembed_b)
EMBED, POS, OUT_W, OUT_B = 0, 1, 2, 3

Layout = namedtuple("Layout", ["vocab_size", "n_ctx", "d_model", "n_heads", "d_ff", "n_out",
                               "learned_positions", "top", "layers"])
Layout.__doc__ = """Sizes of the model (a :class:`~core.model.config.TransformerConfig`'s, under its names)
and where each parameter starts in the flat buffer.

``n_out``: the output layer's width (a classifier's ``n_classes``, a language model's ``vocab_size``);
``top`` (4,): offsets of ``embed``, ``pos`` (-1 without learned positions) and the output
layer's weight and bias (``classifier.W``, ``classifier.b`` or ``unembed``, ``unembed_b``);
``layers`` (L, 16): offsets of each block's arrays, in :data:`LAYER_SLOTS` order."""

Layer = namedtuple("Layer", [slot.replace(".", "_") for slot in LAYER_SLOTS])


@njit(**JIT)
def _mat(flat, at, rows, cols):
    """The (rows, cols) array stored from ``flat[at]`` on (a view)."""
    return flat[at:at + rows * cols].reshape((rows, cols))


@njit(**JIT)
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


@njit(**JIT)
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
                W[i, r, c] = p.attn_W_Q[r, c]
                W[i, r, d + c] = p.attn_W_K[r, c]
                W[i, r, 2 * d + c] = p.attn_W_V[r, c]
        for c in range(d):
            b[i, c], b[i, d + c], b[i, 2 * d + c] = p.attn_b_Q[c], p.attn_b_K[c], p.attn_b_V[c]
    return W, b


@njit(**JIT)
def self_attention(p, Wqkv, bqkv, x, causal, eps, qkv, P, ctx, sub, h1, xhat1, rstd1):
    """The attention sublayer, steps 2-4: ``h1 = LN1(x + MHA(x) + b_O)`` for ``x`` (d, N)."""
    d = x.shape[0]
    # 2. [q; k; v] = (x [W_Q | W_K | W_V] + [b_Q | b_K | b_V])^T                  qkv: (3d, N)
    project(Wqkv, x, qkv, qkv, False)
    add_bias(qkv, bqkv)
    # 3. every head: P = softmax(q k^T / sqrt(d_k)), its output P v   P: (H, Bv, T, T, lanes), ctx: (d, N)
    attention_forward(qkv, 0, qkv, d, 2 * d, causal, P, ctx)
    # 4. h1 = LN1(x + ctx W_O + b_O)                                                h1: (d, N)
    project(p.attn_W_O, ctx, sub, sub, False)
    residual_layernorm(x, sub, p.attn_b_O, p.ln1_g, p.ln1_b, eps, h1, xhat1, rstd1)


@njit(**JIT)
def feed_forward(p, h1, eps, a, sub, y, xhat2, rstd2):
    """The feed-forward sublayer, steps 5-6: ``y = LN2(h1 + relu(h1 W_1 + b_1) W_2 + b_2)``;
    with ``d_ff = 0`` (an attention-only model) there is none: ``y = h1``."""
    if a.shape[0] == 0:
        y[:, :] = h1
        return
    # 5. a = relu(h1 W_1 + b_1)                                                     a: (d_ff, N)
    project(p.ffn_W_1, h1, a, a, False)
    bias_relu(a, p.ffn_b_1)
    # 6. y = LN2(h1 + a W_2 + b_2), the next layer's input                          y: (d, N)
    project(p.ffn_W_2, a, sub, sub, False)
    residual_layernorm(h1, sub, p.ffn_b_2, p.ln2_g, p.ln2_b, eps, y, xhat2, rstd2)


@njit(**JIT)
def feed_forward_backward(p, g, dy, xhat2, rstd2, a, h1, dr, da, dh1):
    """Backward of :func:`feed_forward`: ``dh1`` from ``dy``; ``dr`` and ``da`` are scratch."""
    if a.shape[0] == 0:
        dh1[:, :] = dy
        return
    # 6'. through LN2; dr is the gradient of h1 + a W_2 + b_2
    layernorm_backward(dy, xhat2, rstd2, p.ln2_g, dr, g.ln2_g, g.ln2_b)
    row_sums(dr, g.ffn_b_2)
    gram(a, dr, g.ffn_W_2)                           # dW_2 = a^T dr
    # 5'. through W_2, the ReLU and W_1; the residual path adds dr
    project(p.ffn_W_2.T, dr, da, da, False)          # da = dr W_2^T               (d_ff, N)
    relu_backward(da, a, g.ffn_b_1)
    gram(h1, da, g.ffn_W_1)                          # dW_1 = h1^T da
    project(p.ffn_W_1.T, da, dr, dh1, True)          # dh1 = dr + da W_1^T


@njit(**JIT)
def self_attention_backward(p, g, Wqkv, dh1, xhat1, rstd1, x, qkv, P, ctx, dr, dctx, dqkv, dx):
    """Backward of :func:`self_attention`: ``dx`` from ``dh1``; the rest after ``ctx`` is scratch."""
    d = x.shape[0]
    # 4'. through LN1; dr is the gradient of x + ctx W_O + b_O
    layernorm_backward(dh1, xhat1, rstd1, p.ln1_g, dr, g.ln1_g, g.ln1_b)
    row_sums(dr, g.attn_b_O)
    gram(ctx, dr, g.attn_W_O)                        # dW_O = ctx^T dr
    project(p.attn_W_O.T, dr, dctx, dctx, False)     # dctx = dr W_O^T
    # 3'. the attention core                                                      dqkv: (3d, N)
    attention_backward(qkv, 0, qkv, d, 2 * d, P, dctx, dqkv, dqkv)
    # 2'. the packed projection; the residual path adds dr. Each weight's gradient straight into
    # its place (the same sums as one product into [dW_Q | dW_K | dW_V], without the copy)
    row_sums(dqkv[:d], g.attn_b_Q)
    row_sums(dqkv[d:2 * d], g.attn_b_K)
    row_sums(dqkv[2 * d:], g.attn_b_V)
    gram(x, dqkv[:d], g.attn_W_Q)                    # dW_Q = x^T dq
    gram(x, dqkv[d:2 * d], g.attn_W_K)               # dW_K = x^T dk
    gram(x, dqkv[2 * d:], g.attn_W_V)                # dW_V = x^T dv
    project(Wqkv.T, dqkv, dr, dx, True)              # dx = dr + [dq dk dv] [W_Q|W_K|W_V]^T
