"""Multi-head attention as a sublayer, self or cross: one readable forward, :func:`attend`, and
beside it its hand-written backward, :func:`attend_backward`, which reads what the forward left in
the cache::

    out = attend(x, x, w, cfg, cache, "blocks.0.attn", causal=True)          # masked self-attention
    out = attend(x, memory, w, cfg, cache, "dec.blocks.0.cross")              # cross-attention
    dx_q, dx_kv, grads = attend_backward(d_out, w, cfg, cache, "blocks.0.attn")

``w`` holds the sublayer's ``W_Q ... W_O`` and ``b_Q ... b_O`` (None without biases):
:func:`weights` takes them from a block's parameters. The cache entries, under the sublayer's
name: ``input`` and ``kv_input`` (what the queries and the keys and values were computed from),
``q`` (B, H, T, d_k), ``k``, ``v`` (B, H_kv, T, d_k: grouped-query attention has fewer key/value
heads), ``scores`` and ``weights`` (B, H, Tq, Tk), ``head_outputs``
(B, H, Tq, d_k), ``concat`` (B, Tq, d), ``output``.

Every product, the attention's ``Q K^T`` and ``A V`` included, is :func:`core.model.layers.dense`'s
or :func:`~core.model.layers.product`'s: BLAS at GPT-2's sizes, where they are most of the work,
and our own compiled product at the trained models' sizes. One thread pool for all of them
matters on a small machine: the attention kernels' own threads (Numba) and BLAS's threads, taking
turns layer after layer, slowed each other (a GPT-2-small forward at T = 256 went from 1.05 s to
0.76 s on two cores when the attention moved to BLAS). The backward pass runs the rows of every
head as one compiled loop, with its NumPy formula beside it (:func:`core.model.layers.compiled_or`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core import masks
from core.attention import merge_heads, split_heads    # heads are pure reshapes: one definition
from core.model import layers as L
from core.model import positions as POS
from core.model.tuned import forward as TF
from core.model.names import key

ATTENTION_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
ABLATIONS = ("zero", "mean")


def weights(p: dict, sublayer: str) -> dict:
    """A sublayer's ``W_Q ... b_O`` from a block's parameters under their short names
    (``attn.W_Q``, ``cross.W_Q`` ...); a bias the model does not have is None."""
    return {name: p.get(f"{sublayer}.{name}") for name in ATTENTION_PARAMS}


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
def keeps(cache: dict, name: str) -> bool:
    """Whether the forward cache keeps entry ``name``: a pass run with ``keep=``
    (:func:`core.model.transformer.forward`) drops the block entries it was not asked for."""
    kept = getattr(cache, "keeps", None)
    return kept is None or kept(name)


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """Each row of ``S`` through softmax, in a new array; a ``-inf`` score gets exactly 0."""
    A = S - S.max(axis=-1, keepdims=True)
    np.exp(A, out=A)
    A /= A.sum(axis=-1, keepdims=True)
    return A


def edit_heads(Z: np.ndarray, edits: dict | None, layer: int, key_mask: np.ndarray | None = None) -> np.ndarray:
    r"""Head outputs with the edits for this layer applied (a copy when any).

    Parameters
    ----------
    Z : (B, H, T, d_k)
        Each head's output at each position.
    edits : dict or None
        ``{(layer, head): how}``; only this ``layer``'s entries apply. ``how`` is

        ``"zero"``  the head's output is 0 (zero ablation);
        ``"mean"``  its output at every position is its mean over the sequence's real positions
                    (mean ablation, below);
        an array    its output is replaced by that ``(T, d_k)`` or ``(B, T, d_k)`` array (patching,
                    typically the same head's output on a second prompt).
    layer : int
        The block these head outputs come from.
    key_mask : (B, 1, 1, T) or None
        The additive padding mask the attention's scores took: 0 at a real position, ``-inf`` at
        padding. None: every position is real.

    Notes
    -----
    Mean ablation averages over the positions the mask lets through, :math:`m_{b,t} = 1` for a
    real token and 0 for padding, and writes that mean at every position of the sequence:

    .. math:: Z_{b,h,t} \leftarrow \frac{\sum_s m_{b,s} Z_{b,h,s}}{\sum_s m_{b,s}}
              \quad \text{for every } t

    So a sentence's edited output is the same whether it runs alone or padded in a batch with
    longer ones; without padding it is the plain mean over all ``T`` positions.
    """
    if not edits:
        return Z
    mine = {h: how for (l, h), how in edits.items() if l == layer}
    if not mine:
        return Z
    real = None                                                 # (B, T, 1): True at a real position
    if key_mask is not None:
        key_mask = np.asarray(key_mask)
        if key_mask.shape[-1] != Z.shape[2]:
            raise ValueError(f"The key mask covers {key_mask.shape[-1]} positions, the head outputs "
                             f"{Z.shape[2]}.")
        real = np.isfinite(key_mask.reshape(key_mask.shape[0], -1))[..., None]
    Z = Z.copy()
    for h, how in mine.items():
        if isinstance(how, str) and how == "zero":
            Z[:, h] = 0.0
        elif isinstance(how, str) and how == "mean" and real is None:
            Z[:, h] = Z[:, h].mean(axis=1, keepdims=True)
        elif isinstance(how, str) and how == "mean":
            kept = np.where(real, Z[:, h], 0.0).sum(axis=1, keepdims=True)          # (B, 1, d_k)
            Z[:, h] = kept / real.sum(axis=1, keepdims=True)
        else:
            Z[:, h] = np.broadcast_to(np.asarray(how, dtype=Z.dtype), Z[:, h].shape)
    return Z


def grouped(X: np.ndarray, group: int) -> np.ndarray:
    """``(B, H, T, c) -> (B, H / group, group T, c)``: the rows of the ``group`` query heads that share
    a key/value head (heads ``g group ... g group + group - 1`` read key/value head ``g``), one head
    after another, so that one product per key/value head serves them all. ``group = 1``: a view."""
    B, H, T, c = X.shape
    return X.reshape(B, H // group, group * T, c)


def ungrouped(X: np.ndarray, n_heads: int) -> np.ndarray:
    """:func:`grouped` undone: ``(B, H_kv, group T, c) -> (B, H, T, c)``."""
    B, _, rows, c = X.shape
    return X.reshape(B, n_heads, rows * X.shape[1] // n_heads, c)


def attend(x_q: np.ndarray, x_kv: np.ndarray, w: dict, cfg, cache: dict, name: str, *, causal: bool = False,
           kv: dict | None = None, start: int = 0, edits=None, layer: int = 0,
           key_mask: np.ndarray | None = None, rotary: bool = False, tuned: bool = False) -> np.ndarray:
    r"""Multi-head attention of the queries of ``x_q (B, Tq, d)`` over the keys and values of
    ``x_kv (B, Tk, d)`` (the same array for self-attention); what it computes goes to ``{name}.*``.

    .. math:: A_h = \mathrm{softmax}(Q_h K_{g(h)}^\top / \sqrt{d_k} + M), \quad
              \mathrm{out} = \mathrm{Concat}_h(A_h V_{g(h)})\, W_O + b_O

    With grouped-query attention (``cfg.n_kv_heads`` below ``n_heads``) ``W_K`` and ``W_V`` make
    ``H_kv`` key/value heads (as many as ``W_K (d, H_kv d_k)`` holds), and query head ``h`` reads
    key/value head ``g(h) = h // (H / H_kv)``; otherwise ``g(h) = h``. ``causal`` hides later keys
    from each query. ``kv`` (a dict holding this layer's earlier keys and values, or empty) makes
    it a KV cache: the new keys and values (``H_kv`` heads) are appended, and the new queries, at positions ``start...``, attend over all
    of them. ``rotary``: self-attention with rotary positions, each query and key turned by its
    position (:func:`core.model.positions.rotate`) before the scores and before the KV cache.
    ``edits``: head ablations or patches for block ``layer`` (:func:`edit_heads`), per query head.
    ``key_mask`` (B, 1, 1, Tk), additive (0 or -inf), hides padding keys from every query; in
    self-attention a mean ablation averages over the positions it lets through. ``tuned``: the
    forward pass runs the tuned twins of the rotation, the softmax and the KV cache
    (:func:`core.model.transformer.runs_tuned`, chosen once per pass).

    Cache entries: ``q`` (B, H, Tq, d_k), ``k``, ``v`` (B, H_kv, Tk, d_k), the arrays the scores
    and the weighted sum read (with rotary positions, the rotated queries and keys; with a KV cache,
    every cached key and value); with rotary positions also ``q_unrotated`` and ``k_unrotated``,
    this pass's projections before their turn.
    """
    H, d_k = cfg.n_heads, cfg.d_model // cfg.n_heads
    H_kv = w["W_K"].shape[1] // d_k                         # cfg.kv_heads, or H for a cross-attention of (d, d)
    group = H // H_kv
    # GPT-2's sizes: the products on BLAS. Where the weights go through our own products (packed or
    # compact), they run on our loops and Numba's threads instead: its threads and BLAS's would take turns spinning
    packed = L.own_products(w["W_O"])
    big = cfg.d_model ** 2 >= L.BLAS_FROM and not packed
    # 1. queries (H heads), keys and values (H_kv heads); with rotary positions, queries and keys turned
    QKV = None                                       # a tuned pass: the three as one product where they have one
    if tuned and x_kv is x_q:
        QKV = L.dense_joined(x_q, (w["W_Q"], w["W_K"], w["W_V"]), biases=(w["b_Q"], w["b_K"], w["b_V"]))
    if QKV is not None:                                                                 # (B, T, (H + 2 H_kv) d_k)
        Q, K, V = np.split(QKV, [H * d_k, (H + H_kv) * d_k], axis=-1)
        Q, K, V = split_heads(Q, H), split_heads(K, H_kv), split_heads(V, H_kv)
    else:
        Q = split_heads(L.dense(x_q, w["W_Q"], w["b_Q"]), H)                            # (B, H, Tq, d_k)
        K = split_heads(L.dense(x_kv, w["W_K"], w["b_K"]), H_kv)                        # (B, H_kv, Tk, d_k)
        V = split_heads(L.dense(x_kv, w["W_V"], w["b_V"]), H_kv)
    if rotary:
        cache[key(name, "q_unrotated")], cache[key(name, "k_unrotated")] = Q, K
        cos, sin = POS.rotary_angles(start, Q.shape[2], d_k, cfg.rope_base, Q.dtype)   # (Tq, d_k)
        rotate = TF.rotate if tuned else POS.rotate
        L.note(rotate)
        Q, K = rotate(Q, cos, sin), rotate(K, cos, sin)
    if kv is not None and tuned:
        K, V = TF.append_kv(kv, K, V)                                                    # the same, without a copy per token
    elif kv is not None:
        if "K" in kv:
            K = np.concatenate([kv["K"], K], axis=2)                                     # (B, H_kv, start+T, d_k)
            V = np.concatenate([kv["V"], V], axis=2)
        kv["K"], kv["V"] = K, V
    cache[key(name, "input")], cache[key(name, "kv_input")] = x_q, x_kv
    cache[key(name, "q")], cache[key(name, "k")], cache[key(name, "v")] = Q, K, V
    # 2. scaled, masked scores and their row softmax, each head's weighted average of the values;
    #    the query heads that share a key/value head go through one product together.
    #    A tuned pass that keeps neither scores nor weights computes Z without them (TF.attention)
    Z = None
    if tuned and not (keeps(cache, key(name, "scores")) or keeps(cache, key(name, "weights"))):
        Z = TF.attention(Q, K, V, causal, key_mask)                                     # (B, H, Tq, d_k)
        L.note(TF.attention)
    if Z is None:
        S = ungrouped(L.product(grouped(Q, group), K.swapaxes(-1, -2), big, packed), H)   # (B, H, Tq, Tk)
        S *= S.dtype.type(1.0 / math.sqrt(d_k))
        if causal:
            S += masks.causal(Q.shape[2], x_q.dtype, start=start)                          # (Tq, start + Tq)
        if key_mask is not None:
            S += key_mask
        cache[key(name, "scores")] = S
        softmax = TF.softmax_rows if tuned else softmax_rows
        L.note(softmax)
        A = softmax(S)
        cache[key(name, "weights")] = A
        Z = ungrouped(L.product(grouped(A, group), V, big, packed), H)                   # (B, H, Tq, d_k)
    # 3. head edits (ablation, patching), then the heads side by side and the output projection
    Z = edit_heads(Z, edits, layer, key_mask if x_kv is x_q else None)    # self-attention: the keys' mask is the queries'
    cache[key(name, "head_outputs")] = Z
    concat = merge_heads(Z)                                                              # (B, Tq, H*d_k)
    cache[key(name, "concat")] = concat
    out = L.dense(concat, w["W_O"], w["b_O"])                                            # (B, Tq, d)
    cache[key(name, "output")] = out
    return out


# ----------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _attention_rows_backward(Q, K, V, A, dZ, scale, dQ, dK, dV):
    """Gradients of :func:`_attention_rows` from ``dZ``, for every (b, h), query i by query i:

        dA[j] = dZ_i . V_j            dV_j += A[i, j] dZ_i                 (Z_i = sum_j A[i, j] V_j)
        dS[j] = A[i, j] (dA[j] - sum_l A[i, l] dA[l]) / scale                 (softmax, then the scale)
        dQ_i  = sum_j dS[j] K_j       dK_j += dS[j] Q_i                    (S[i, j] = Q_i . K_j)

    Masked entries have A = 0, so they pass no gradient.
    """
    B, H, Tq, d_k = Q.shape
    Tk = K.shape[2]
    dA = np.empty(Tk)
    for b in range(B):
        for h in range(H):
            dK[b, h] = 0.0
            dV[b, h] = 0.0
            for i in range(Tq):
                mix = 0.0
                for j in range(Tk):
                    dot = 0.0
                    for c in range(d_k):
                        dot += dZ[b, h, i, c] * V[b, h, j, c]
                        dV[b, h, j, c] += A[b, h, i, j] * dZ[b, h, i, c]
                    dA[j] = dot
                    mix += A[b, h, i, j] * dot
                for c in range(d_k):
                    dQ[b, h, i, c] = 0.0
                for j in range(Tk):
                    dS = A[b, h, i, j] * (dA[j] - mix) / scale
                    for c in range(d_k):
                        dQ[b, h, i, c] += dS * K[b, h, j, c]
                        dK[b, h, j, c] += dS * Q[b, h, i, c]


def _attention_rows_backward_numpy(Q, K, V, A, dZ, scale, dQ, dK, dV):
    """:func:`_attention_rows_backward` over whole arrays."""
    dA = dZ @ V.swapaxes(-1, -2)                                    # (B, H, Tq, Tk)
    dV[...] = A.swapaxes(-1, -2) @ dZ
    dS = A * (dA - (A * dA).sum(axis=-1, keepdims=True)) / scale
    dQ[...] = dS @ K
    dK[...] = dS.swapaxes(-1, -2) @ Q


def attend_backward(d_out: np.ndarray, w: dict, cfg, cache: dict, name: str, *, rotary: bool = False):
    """Backward of :func:`attend` from ``d_out``, step by step in reverse, on the forward pass's own
    cache (a whole sequence from position 0: no KV cache, no head edits). ``rotary`` as the forward
    pass had it.

    Returns
    -------
    dx_q : (B, Tq, d)
    dx_kv : (B, Tk, d); for self-attention add it to ``dx_q``
    grads : ``W_Q ... b_O`` (the biases only when the model has them)
    """
    H, d_k = cfg.n_heads, cfg.d_model // cfg.n_heads
    group = H // cache[key(name, "k")].shape[1]                                        # query heads per key/value head
    Q = np.ascontiguousarray(grouped(cache[key(name, "q")], group))                    # (B, H_kv, group Tq, d_k)
    K, V = (np.ascontiguousarray(cache[key(name, n)]) for n in "kv")                     # (B, H_kv, Tk, d_k)
    A = np.ascontiguousarray(grouped(cache[key(name, "weights")], group))              # (B, H_kv, group Tq, Tk)
    g = {}
    # 3. output projection
    d_concat, g["W_O"], g["b_O"] = L.linear_backward(d_out, cache[key(name, "concat")], w["W_O"])
    # 2. back into heads, through Z = A V, the softmax and the scaled scores; the query heads that
    #    share a key/value head are rows of one problem, so their shares of dK and dV add up
    dZ = np.ascontiguousarray(grouped(split_heads(d_concat, H), group))                 # (B, H_kv, group Tq, d_k)
    dQ, dK, dV = np.empty_like(dZ), np.empty_like(K), np.empty_like(V)
    L.compiled_or(_attention_rows_backward, _attention_rows_backward_numpy, Q, K, V, A, dZ, math.sqrt(d_k),
                  dQ, dK, dV)
    dQ = ungrouped(dQ, H)                                                                # (B, H, Tq, d_k)
    if rotary:                                                                           # back through the turn
        cos, sin = POS.rotary_angles(0, dQ.shape[2], d_k, cfg.rope_base, dQ.dtype)
        dQ, dK = POS.rotate_backward(dQ, cos, sin), POS.rotate_backward(dK, cos, sin)
    # 1. the projections
    x_q, x_kv = cache[key(name, "input")], cache[key(name, "kv_input")]
    dx_q, g["W_Q"], g["b_Q"] = L.linear_backward(merge_heads(dQ), x_q, w["W_Q"])
    dx_k, g["W_K"], g["b_K"] = L.linear_backward(merge_heads(dK), x_kv, w["W_K"])
    dx_v, g["W_V"], g["b_V"] = L.linear_backward(merge_heads(dV), x_kv, w["W_V"])
    return dx_q, dx_k + dx_v, {n: v for n, v in g.items() if w[n] is not None}
