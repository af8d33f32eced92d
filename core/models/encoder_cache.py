"""The tiny encoder's forward cache: every intermediate of the forward pass, by name, and head
ablation (what "Inside a trained model" reads instead of recomputing)."""
from __future__ import annotations

import numpy as np

from core.models.compiled import attention as compiled_attention
from core.models.compiled import encoder_step as K
from core.models.compiled import elementwise, ends, products, sublayers
from core.models.compiled.sublayers import LAYER_PARAMS
from core.models.encoder_config import (EncoderConfig, _mat_view, _pe_for, check_params, check_tokens, flatten,
                                        layout)


# Names of the per-layer entries of :func:`forward_cache`, in the order the forward pass makes them
# (``cache[f"layers.{i}.{name}"]``); shapes for a batch of B sequences of T tokens.
CACHE_LAYER_ENTRIES = {
    "resid_pre": "(B, T, d)    the layer's input h",
    "q": "(B, H, T, d_k) queries h W_Q + b_Q, split by head",
    "k": "(B, H, T, d_k) keys",
    "v": "(B, H, T, d_k) values",
    "weights": "(B, H, T, T) attention weights softmax(q k^T / sqrt(d_k)), rows sum to 1",
    "head_outputs": "(B, H, T, d_k) each head's weights @ v (after any head ablation)",
    "concat": "(B, T, d)    the heads' outputs side by side",
    "attn_out": "(B, T, d)    concat W_O + b_O, the attention sublayer's output",
    "ln1_in": "(B, T, d)    the first residual sum h + attn_out, before LayerNorm 1",
    "ln1_mean": "(B, T)       its mean over the d features",
    "ln1_rstd": "(B, T)       1 / sqrt(var + eps) of it",
    "ln1_xhat": "(B, T, d)    normalised: (ln1_in - mean) * rstd, before gain and bias",
    "ln1_out": "(B, T, d)    ln1_g * xhat + ln1_b",
    "ffn_pre": "(B, T, d_ff) ln1_out W_1 + b_1, before the ReLU",
    "ffn_hidden": "(B, T, d_ff) relu(ffn_pre)",
    "ffn_out": "(B, T, d)    ffn_hidden W_2 + b_2",
    "ln2_in": "(B, T, d)    the second residual sum ln1_out + ffn_out",
    "ln2_mean": "(B, T)",
    "ln2_rstd": "(B, T)",
    "ln2_xhat": "(B, T, d)",
    "ln2_out": "(B, T, d)    the layer's output: the next layer's resid_pre",
}


def forward_cache(params: dict, tokens, cfg: EncoderConfig, *, head_scale=None, head_fill=None):
    """The forward pass with every intermediate kept, by name: what a page reads instead of
    recomputing.

    It runs the compiled kernels of :func:`forward` (``core.models.compiled``), on the same
    chunks of ``CHUNK`` sequences and in the same order as its ``forward_chunk``, one kernel call
    per step, and keeps what ``forward_chunk`` keeps for the backward pass (the layer inputs,
    queries/keys/values, attention weights, heads' outputs, normalised sums and ``1/std``, ReLU
    outputs) plus the few values it only holds in a scratch buffer (each sublayer's output, the
    residual sums before the norms, the FFN's pre-activation). The logits, attention weights and
    hidden states equal :func:`forward`'s bit for bit (tests check it).

    Head ablation (``head_scale``, ``head_fill``): between the attention and ``W_O``, head ``h`` of
    layer ``i`` has its output ``z`` (B, T, d_k) replaced by

        ``z <- s z + (1 - s) f``,   ``s = head_scale[i, h]``, ``f = head_fill[i][:, h d_k:(h+1) d_k]``

    ``head_scale`` (L, H) of 1 (None) changes nothing; 0 removes a head: its output becomes the
    fill, zero (``head_fill`` None) or e.g. its mean over a data set (``head_fill`` (L, T, d),
    per position and feature, in the ``concat`` layout). Heads whose scale is exactly 1 are not
    touched, so ablating nothing reproduces :func:`forward` exactly. Removing every head of a
    layer leaves that sublayer's output equal to ``b_O`` (to ``fill W_O + b_O`` with a fill).

    Returns
    -------
    logits : (B, C)
    cache : dict: ``tokens`` (B, T); ``tok_embed`` (B, T, d) the embedding rows and ``pos_embed``
        (T, d) the positional table; ``layers.{i}.{name}`` for every ``name`` of
        :data:`CACHE_LAYER_ENTRIES`; ``hidden`` (B, T, d) the encoder's output, ``pooled`` (B, d)
        its mean over positions, ``logits`` (B, C); ``attn`` (L, B, H, T, T) as :func:`forward`
        returns it.
    """
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    scale, fill = _check_ablation(head_scale, head_fill, cfg, tok.shape[1], flat.dtype)
    return _forward_steps(flat, tok, cfg, scale, fill, keep=True)


def forward_ablated(params: dict, tokens, cfg: EncoderConfig, head_scale, head_fill=None) -> np.ndarray:
    """The logits (B, C) of :func:`forward_cache` with the same head ablation, keeping nothing else
    (cheap enough to score a test set once per head)."""
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    flat = flatten(params, cfg)
    scale, fill = _check_ablation(head_scale, head_fill, cfg, tok.shape[1], flat.dtype)
    return _forward_steps(flat, tok, cfg, scale, fill, keep=False)[0]


def _check_ablation(head_scale, head_fill, cfg: EncoderConfig, T: int, dtype):
    """``head_scale`` as (L, H) floats (None: all ones) and ``head_fill`` as (L, T, d) or None."""
    L, H, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    scale = np.ones((L, H)) if head_scale is None else np.asarray(head_scale, dtype=float)
    if scale.shape != (L, H) or not np.isfinite(scale).all():
        raise ValueError(f"head_scale must be {L} x {H} finite numbers (layers x heads), got shape {scale.shape}.")
    if head_fill is None:
        return scale, None
    fill = np.asarray(head_fill, dtype=dtype)
    if fill.shape[:1] + fill.shape[2:] != (L, d) or fill.ndim != 3 or fill.shape[1] < T or not np.isfinite(fill).all():
        raise ValueError(f"head_fill must be finite numbers of shape (layers, positions >= {T}, d_model) = "
                         f"({L}, {T}, {d}), got shape {fill.shape}.")
    return scale, np.ascontiguousarray(fill[:, :T])


def _forward_steps(flat, tok, cfg: EncoderConfig, scale, fill, *, keep: bool):
    """:func:`forward_cache`'s work on checked inputs: chunk by chunk as ``compiled.encoder_step.run``."""
    lay = layout(cfg)
    B, T = tok.shape
    pe = _pe_for(flat, cfg, T)
    Wqkv, bqkv = sublayers.packed_qkv(flat, lay)
    logits = np.empty((B, cfg.n_classes), flat.dtype)
    parts = []
    for b0 in range(0, B, K.CHUNK):
        b1 = min(B, b0 + K.CHUNK)
        chunk = K.padded_chunk(tok, b0, b1, flat)
        acts = K.new_activations(lay, T, chunk.shape[0], flat)
        extra = _chunk_steps(flat, cfg, Wqkv, bqkv, chunk, pe, acts, scale, fill)
        logits[b0:b1] = acts.logits[:b1 - b0]
        if keep:
            parts.append(_by_sequence(acts, extra, cfg, b1 - b0))
    if not keep:
        return logits, None
    cache = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    cache["tokens"] = tok
    cache["tok_embed"] = _mat_view(flat, cfg, "embed")[tok]
    cache["pos_embed"] = np.array(pe)
    cache["logits"] = logits
    cache["attn"] = np.stack([cache[f"layers.{i}.weights"] for i in range(cfg.n_layers)])
    return logits, cache


def _chunk_steps(flat, cfg: EncoderConfig, Wqkv, bqkv, tokens, pe, acts, scale, fill) -> dict:
    """``compiled.encoder_step.forward_chunk``, step by step: the same kernels, called in the same order
    on the same arrays, writing the same ``acts``; returns what it keeps only in scratch:
    ``attn_out``, ``ln1_in``, ``ffn_pre``, ``ffn_out``, ``ln2_in`` (each (L, features, N))."""
    Bp, T = tokens.shape
    L, d, F, N = cfg.n_layers, cfg.d_model, cfg.d_ff, T * Bp
    dt, eps = flat.dtype, float(cfg.ln_eps)
    lanes = acts.P.shape[-1]
    kept = {name: np.empty((L, rows, N), dt)
            for name, rows in (("attn_out", d), ("ln1_in", d), ("ffn_pre", F), ("ffn_out", d), ("ln2_in", d))}
    sub = np.empty((d, N), dt)
    position = (np.arange(N) // lanes) % T                          # the position of each column
    # 1. h = embed[tokens] + PE                                                   x[0]: (d, N)
    ends.embed_forward(tokens, _mat_view(flat, cfg, "embed"), pe, acts.x[0])
    for i in range(L):
        p = {name: _mat_view(flat, cfg, f"layers.{i}.{name}") for name in LAYER_PARAMS}
        x, qkv, ctx, h1, a = acts.x[i], acts.qkv[i], acts.ctx[i], acts.h1[i], acts.a[i]
        # 2. [q; k; v] = (h [W_Q | W_K | W_V] + [b_Q | b_K | b_V])^T                qkv: (3d, N)
        products.project(Wqkv[i], x, qkv, qkv, False)
        elementwise.add_bias(qkv, bqkv[i])
        # 3. every head: softmax(q k^T / sqrt(d_k)) v                    P: (H, Bv, T, T, lanes), ctx: (d, N)
        compiled_attention.attention_forward(qkv, 0, qkv, d, 2 * d, False, acts.P[i], ctx)
        # 3b. head ablation: z_h <- s z_h + (1 - s) fill_h, only for heads with s != 1
        for h in np.flatnonzero(scale[i] != 1.0):
            rows = slice(h * cfg.d_k, (h + 1) * cfg.d_k)
            ctx[rows] *= dt.type(scale[i, h])
            if fill is not None:
                ctx[rows] += dt.type(1.0 - scale[i, h]) * fill[i][position, rows].T
        # 4. h1 = LN1(h + ctx W_O + b_O); the kernel adds (h + ctx W_O) + b_O, and so do we
        products.project(p["W_O"], ctx, sub, sub, False)
        kept["attn_out"][i] = sub + p["b_O"][:, None]
        kept["ln1_in"][i] = x + sub + p["b_O"][:, None]
        elementwise.residual_layernorm(x, sub, p["b_O"], p["ln1_g"], p["ln1_b"], eps, h1, acts.xhat1[i], acts.rstd1[i])
        # 5. a = relu(h1 W_1 + b_1)                                                 a: (d_ff, N)
        products.project(p["W_1"], h1, a, a, False)
        kept["ffn_pre"][i] = a + p["b_1"][:, None]
        elementwise.bias_relu(a, p["b_1"])
        # 6. h = LN2(h1 + a W_2 + b_2), the next layer's input                    x[i+1]: (d, N)
        products.project(p["W_2"], a, sub, sub, False)
        kept["ffn_out"][i] = sub + p["b_2"][:, None]
        kept["ln2_in"][i] = h1 + sub + p["b_2"][:, None]
        elementwise.residual_layernorm(h1, sub, p["b_2"], p["ln2_g"], p["ln2_b"], eps, acts.x[i + 1], acts.xhat2[i],
                             acts.rstd2[i])
    # 7. logits = mean over positions of h, then W_cls and b_cls       pooled: (d, Bp), logits: (Bp, C)
    ends.mean_pool(acts.x[L], T, acts.pooled)
    ends.classify(acts.pooled, _mat_view(flat, cfg, "W_cls"), _mat_view(flat, cfg, "b_cls"), acts.logits)
    return kept


def _by_sequence(acts, kept: dict, cfg: EncoderConfig, n: int) -> dict:
    """A chunk's activations, from the kernels' (features, N) column layout back to (sequence,
    position, ...), for its first ``n`` sequences (the rest are padding)."""
    L, H, dk, d = cfg.n_layers, cfg.n_heads, cfg.d_k, cfg.d_model
    Bv, T, lanes = acts.P.shape[2], acts.P.shape[3], acts.P.shape[-1]
    b, t = np.arange(n)[:, None], np.arange(T)[None, :]
    col = ((b // lanes) * T + t) * lanes + b % lanes                 # (n, T): ends.column(b, t, T, lanes)

    def tokens_first(rows):                                          # (F, N) -> (n, T, F)
        return np.ascontiguousarray(rows[:, col].transpose(1, 2, 0))

    def stats(row):                                                  # (N,) -> (n, T)
        return np.ascontiguousarray(row[col])

    out = {}
    for i in range(L):
        qkv = tokens_first(acts.qkv[i]).reshape(n, T, 3, H, dk).transpose(2, 0, 3, 1, 4)  # (3, n, H, T, dk)
        concat = tokens_first(acts.ctx[i])
        ln1_in, ln2_in = tokens_first(kept["ln1_in"][i]), tokens_first(kept["ln2_in"][i])
        # mean as the kernel sums it: feature by feature in order, then times 1/d
        inv_d = acts.x.dtype.type(1.0 / d)
        out.update({
            f"layers.{i}.resid_pre": tokens_first(acts.x[i]),
            f"layers.{i}.q": np.ascontiguousarray(qkv[0]), f"layers.{i}.k": np.ascontiguousarray(qkv[1]),
            f"layers.{i}.v": np.ascontiguousarray(qkv[2]),
            f"layers.{i}.weights": np.ascontiguousarray(
                acts.P[i].transpose(1, 4, 0, 2, 3).reshape(Bv * lanes, H, T, T)[:n]),
            f"layers.{i}.head_outputs": np.ascontiguousarray(concat.reshape(n, T, H, dk).transpose(0, 2, 1, 3)),
            f"layers.{i}.concat": concat,
            f"layers.{i}.attn_out": tokens_first(kept["attn_out"][i]),
            f"layers.{i}.ln1_in": ln1_in,
            f"layers.{i}.ln1_mean": stats(kept["ln1_in"][i].sum(axis=0) * inv_d),
            f"layers.{i}.ln1_rstd": stats(acts.rstd1[i]),
            f"layers.{i}.ln1_xhat": tokens_first(acts.xhat1[i]),
            f"layers.{i}.ln1_out": tokens_first(acts.h1[i]),
            f"layers.{i}.ffn_pre": tokens_first(kept["ffn_pre"][i]),
            f"layers.{i}.ffn_hidden": tokens_first(acts.a[i]),
            f"layers.{i}.ffn_out": tokens_first(kept["ffn_out"][i]),
            f"layers.{i}.ln2_in": ln2_in,
            f"layers.{i}.ln2_mean": stats(kept["ln2_in"][i].sum(axis=0) * inv_d),
            f"layers.{i}.ln2_rstd": stats(acts.rstd2[i]),
            f"layers.{i}.ln2_xhat": tokens_first(acts.xhat2[i]),
            f"layers.{i}.ln2_out": tokens_first(acts.x[i + 1]),
        })
    out["hidden"] = tokens_first(acts.x[L])
    out["pooled"] = np.ascontiguousarray(acts.pooled[:, :n].T)
    return out
