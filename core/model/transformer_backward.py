"""The backward pass of :mod:`core.model.transformer`, by hand, step by step in reverse: the
readable track of training, for every setting of the one model (post- or pre-norm, ReLU or GELU,
any positions, tied or separate unembedding with or without its bias, a final LayerNorm, biases
on or off, causal or not, attention-only, a language model or a classifier)::

    loss, grads = loss_and_grads(params, cfg, tokens, targets)     # mean cross-entropy, its gradient
    grads = backward(params, cfg, cache, d_logits)                 # from a forward pass's cache

Each sublayer's gradient is :mod:`core.model.layers`' (``attention_backward``,
``layer_norm_backward``, ``linear_backward``, ``gelu_tanh_backward``). What they need comes from the
forward cache, in the one vocabulary (``blocks.{i}.resid_pre``, ``blocks.{i}.ln1.mean|std``,
``blocks.{i}.attn.weights|concat|output``, ``blocks.{i}.ffn.hidden|output`` ...). What the forward
pass does not keep costs one matrix product at most to recompute here: each LayerNorm's normalised
input (from its input and its statistics) and output, each attention's queries, keys and values,
GELU's input. ``grads`` has the parameters' names, shapes and dtype.
"""
from __future__ import annotations

import numpy as np

from core.attention import split_heads
from core.model import layers as L
from core.model import multi_head as MH
from core.model import transformer as tr
from core.model import config as C
from core.model.config import TransformerConfig


# ----------------------------------------------------------------------------------------------
# the sublayers, from what the forward pass left in the cache
# ----------------------------------------------------------------------------------------------
def _normalised(x: np.ndarray, cache: dict, name: str) -> np.ndarray:
    """``(x - mean) / std``: LayerNorm ``name``'s normalised input, from its statistics."""
    return (x - cache[f"{name}.mean"][..., None]) / cache[f"{name}.std"][..., None]


def layer_norm_output(x: np.ndarray, g: np.ndarray, b: np.ndarray, cache: dict, name: str) -> np.ndarray:
    """``LN(x) = g * (x - mean) / std + b``, recomputed (a pre-norm sublayer's input)."""
    return _normalised(x, cache, name) * g + b


def layer_norm_backward(dy: np.ndarray, x: np.ndarray, g: np.ndarray, cache: dict, name: str):
    """``(dx, dg, db)`` of ``y = LN(x)`` (:func:`layers.layer_norm_backward`); ``x`` is its input."""
    d = x.shape[-1]
    rebuilt = {"xhat": np.ascontiguousarray(_normalised(x, cache, name).reshape(-1, d)),
               "rstd": np.ascontiguousarray(1.0 / cache[f"{name}.std"].reshape(-1)), "g": g}
    return L.layer_norm_backward(dy, rebuilt)


def attention_backward(d_out: np.ndarray, x: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict,
                       name: str):
    """``(dx, grads)`` of ``out = MHA(x)`` (self-attention): :func:`multi_head.attention_backward` on the
    cached ``weights`` and ``concat`` and the queries, keys and values recomputed from ``x``."""
    H = cfg.n_heads
    w = {k: p.get(f"attn.{k}") for k in L.ATTENTION_PARAMS}                   # biases None without bias
    Q, K, V = (np.ascontiguousarray(split_heads(tr.dense(x, w[f"W_{n}"], w[f"b_{n}"]), H))
               for n in "QKV")                                                 # (B, H, T, d_k)
    rebuilt = {"x_q": x, "x_kv": x, "Q": Q, "K": K, "V": V,
               "weights": np.ascontiguousarray(cache[f"{name}.weights"]), "concat": cache[f"{name}.concat"]}
    dq, dkv, g = MH.attention_backward(d_out, rebuilt, w)
    return dq + dkv, {f"attn.{k}": v for k, v in g.items() if w[k] is not None}   # x gave Q, K and V


def feed_forward_backward(dy: np.ndarray, x: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict,
                          name: str):
    """``(dx, grads)`` of ``y = act(x W_1 + b_1) W_2 + b_2``, ReLU or GELU (tanh form)."""
    g = {}
    hidden = cache[f"{name}.hidden"]                                          # (B, T, d_ff)
    d_hidden, g["ffn.W_2"], g["ffn.b_2"] = L.linear_backward(dy, hidden, p["ffn.W_2"])
    if cfg.activation == "gelu_tanh":
        pre = tr.dense(x, p["ffn.W_1"], p.get("ffn.b_1"))                      # GELU's input, recomputed
        d_pre = L.gelu_tanh_backward(d_hidden, pre)
    else:
        d_pre = d_hidden * (hidden > 0)                                       # ReLU passes where it was positive
    dx, g["ffn.W_1"], g["ffn.b_1"] = L.linear_backward(d_pre, x, p["ffn.W_1"])
    return dx, {k: v for k, v in g.items() if cfg.bias or ".W_" in k}


# ----------------------------------------------------------------------------------------------
# one block, in reverse
# ----------------------------------------------------------------------------------------------
def block_backward(dh: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict, name: str):
    """``(d resid_pre, grads)`` of one block (:func:`transformer.block`) from ``d resid_post``;
    ``grads`` under the block's short names (``attn.W_Q``, ``ln1.g`` ...)."""
    g = {}
    h_in, h_mid = cache[f"{name}.resid_pre"], cache[f"{name}.resid_mid"]
    if cfg.norm == "pre":
        # 2. h_out = h_mid + FFN(LN2(h_mid)): the residual passes dh on, the sublayer adds its share
        if cfg.d_ff:
            f_in = layer_norm_output(h_mid, p["ln2.g"], p["ln2.b"], cache, f"{name}.ln2")
            d_f, g_ffn = feed_forward_backward(dh, f_in, p, cfg, cache, f"{name}.ffn")
            d_mid, g["ln2.g"], g["ln2.b"] = layer_norm_backward(d_f, h_mid, p["ln2.g"], cache, f"{name}.ln2")
            dh = dh + d_mid
            g.update(g_ffn)
        # 1. h_mid = h_in + MHA(LN1(h_in))
        a_in = layer_norm_output(h_in, p["ln1.g"], p["ln1.b"], cache, f"{name}.ln1")
        d_a, g_attn = attention_backward(dh, a_in, p, cfg, cache, f"{name}.attn")
        d_in, g["ln1.g"], g["ln1.b"] = layer_norm_backward(d_a, h_in, p["ln1.g"], cache, f"{name}.ln1")
        dh = dh + d_in
    else:
        # 2. h_out = LN2(h_mid + FFN(h_mid)): through the norm, then the residual and the sublayer
        if cfg.d_ff:
            ln2_in = h_mid + cache[f"{name}.ffn.output"]
            d_sum, g["ln2.g"], g["ln2.b"] = layer_norm_backward(dh, ln2_in, p["ln2.g"], cache, f"{name}.ln2")
            d_f, g_ffn = feed_forward_backward(d_sum, h_mid, p, cfg, cache, f"{name}.ffn")
            dh = d_sum + d_f
            g.update(g_ffn)
        # 1. h_mid = LN1(h_in + MHA(h_in))
        ln1_in = h_in + cache[f"{name}.attn.output"]
        d_sum, g["ln1.g"], g["ln1.b"] = layer_norm_backward(dh, ln1_in, p["ln1.g"], cache, f"{name}.ln1")
        d_a, g_attn = attention_backward(d_sum, h_in, p, cfg, cache, f"{name}.attn")
        dh = d_sum + d_a
    g.update(g_attn)
    return dh, g


# ----------------------------------------------------------------------------------------------
# the ends: the head (unembedding or classifier) and the embeddings
# ----------------------------------------------------------------------------------------------
def head_backward(d_logits: np.ndarray, params: dict, cfg: TransformerConfig, cache: dict, grads: dict, *,
                  h_last=None):
    """Gradient of the last block's output ``h_last`` (by default the cache's last ``resid_post``),
    from ``d_logits``, through the head and the final LayerNorm; the head's parameter gradients go
    into ``grads`` (a tied unembedding's share of ``embed`` under ``embed``)."""
    if h_last is None:
        h_last = cache[f"blocks.{cfg.n_layers - 1}.resid_post"]                # (B, T, d)
    h = h_last
    if cfg.final_ln:
        h = layer_norm_output(h_last, params["ln_final.g"], params["ln_final.b"], cache, "ln_final")
    if cfg.head == "classify":
        # logits = pooled W + b, pooled = mean_t h: each position gets 1/T of the pooled gradient
        d_pooled, grads["classifier.W"], grads["classifier.b"] = L.linear_backward(
            d_logits, cache["pooled"], params["classifier.W"])                # (B, d)
        dh = np.repeat(d_pooled[:, None, :] / h.shape[1], h.shape[1], axis=1)  # (B, T, d)
    else:
        # logits = h W (+ unembed_b), W = embed^T when tied
        W = params["embed"].T if cfg.tied_unembed else params["unembed"]      # (d, V)
        dh, dW, db = L.linear_backward(d_logits, h, W)
        if cfg.tied_unembed:
            grads["embed"] = np.ascontiguousarray(dW.T)      # the unembedding's share; embed_backward adds the rest
        else:
            grads["unembed"] = dW
        if cfg.unembed_b:
            grads["unembed_b"] = db
    if cfg.final_ln:
        dh, grads["ln_final.g"], grads["ln_final.b"] = layer_norm_backward(
            dh, h_last, params["ln_final.g"], cache, "ln_final")
    return dh


def embed_backward(dx: np.ndarray, params: dict, cfg: TransformerConfig, tokens: np.ndarray, grads: dict) -> None:
    """Scatter the gradient of ``embed[tokens] + pos`` into the embedding rows (added to a tied
    unembedding's share) and the learned position rows."""
    d_embed = grads.get("embed", np.zeros_like(params["embed"]))
    np.add.at(d_embed, tokens.reshape(-1), dx.reshape(-1, cfg.d_model))       # a token seen twice adds twice
    grads["embed"] = d_embed
    if cfg.positional == "learned":
        d_pos = np.zeros_like(params["pos"])
        d_pos[:tokens.shape[1]] = dx.sum(axis=0)
        grads["pos"] = d_pos


# ----------------------------------------------------------------------------------------------
# the whole model
# ----------------------------------------------------------------------------------------------
def backward(params: dict, cfg: TransformerConfig, cache: dict, d_logits: np.ndarray) -> dict:
    """The gradient of every parameter from ``d_logits`` (the gradient of the loss with respect to
    the logits) and the cache of :func:`transformer.forward` on the same parameters (a whole
    sequence from position 0, no head edits).

    Returns
    -------
    grads : dict, the same names, shapes and dtype as ``params``
    """
    C.check_params(params, cfg)
    if np.shape(d_logits) != np.shape(cache["logits"]):
        raise ValueError(f"d_logits has shape {np.shape(d_logits)}; the logits have {np.shape(cache['logits'])}.")
    if cache["blocks.0.attn.weights"].shape[-1] != cache["tokens"].shape[1]:
        raise ValueError("This cache is from a KV-cached forward pass; the backward pass needs the whole sequence.")
    if "edited_heads" in cache:
        raise ValueError("This cache is from a forward pass with heads ablated or patched; the backward pass is "
                         "the unedited model's.")
    grads: dict[str, np.ndarray] = {}
    # 3. the head and the final LayerNorm
    dh = head_backward(d_logits, params, cfg, cache, grads)
    # 2. the blocks, last first
    for i in reversed(range(cfg.n_layers)):
        prefix = f"blocks.{i}."
        dh, g = block_backward(dh, tr.block_params(params, prefix), cfg, cache, f"blocks.{i}")
        grads.update({prefix + name: value for name, value in g.items()})
    # 1. the embeddings
    embed_backward(dh, params, cfg, cache["tokens"], grads)
    return {name: grads[name] for name in C.param_shapes(cfg)}


def trainable(cfg: TransformerConfig) -> None:
    """Refuse what the hand-written backward pass does not cover: BERT's settings run forward only."""
    extras = [name for name, value in (("head='none'", cfg.head == "none"), ("activation='gelu_erf'",
              cfg.activation == "gelu_erf"), ("token types", cfg.n_token_types), ("an embedding LayerNorm",
              cfg.embed_ln), ("a pooler", cfg.pooler)) if value]
    if extras:
        raise ValueError(f"This model has {', '.join(extras)}: it runs forward here, but has no backward pass "
                         f"to train with (train a language model or a classifier instead).")


def check_targets(targets, cfg: TransformerConfig, tokens: np.ndarray) -> np.ndarray:
    """Targets as int64: one per position ``(B, T)`` for a language model, one per sequence ``(B,)``
    for a classifier; ids in range."""
    y = np.asarray(targets)
    if cfg.head == "classify":
        shape, top, what = tokens.shape[:1], cfg.n_classes, "class ids, one per sequence"
    else:
        shape, top, what = tokens.shape, cfg.vocab_size, "token ids, one per position"
        y = y[None, :] if y.ndim == 1 else y
    if y.dtype.kind not in "iu" or y.shape != shape:
        raise ValueError(f"targets must be {what}: shape {shape}, got {y.dtype} with shape {np.shape(targets)}.")
    if y.min() < 0 or y.max() >= top:
        raise ValueError(f"targets must lie in 0..{top - 1}; got {y.min()}..{y.max()}.")
    return y.astype(np.int64, copy=False)


def loss_and_grads(params: dict, cfg: TransformerConfig, tokens, targets):
    r"""Mean cross-entropy and its gradient for every parameter: forward, then :func:`backward`.

    .. math:: \mathcal{L} = -\frac{1}{N} \sum_n \log \mathrm{softmax}(\mathrm{logits}_n)[y_n]

    over every position of every sequence (a language model, ``N = B T``: the decoder's loss) or
    over the sequences (a classifier, ``N = B``: the encoder's).

    Parameters
    ----------
    tokens : ids ``(T,)`` or ``(B, T)``
    targets : ``(B, T)`` (or ``(T,)``) next-token ids for ``head="lm"``; ``(B,)`` class ids for ``"classify"``

    Returns
    -------
    loss : float
    grads : dict, the same names, shapes and dtype as ``params``
    """
    loss, _, grads = forward_backward(params, cfg, tokens, targets)
    return loss, grads


def forward_backward(params: dict, cfg: TransformerConfig, tokens, targets):
    """One readable training step's arithmetic: ``(loss, logits, grads)`` (:func:`loss_and_grads`,
    and the logits, from which a classifier's step counts its correct answers)."""
    trainable(cfg)
    logits, cache = tr.forward(params, cfg, tokens)
    y = check_targets(targets, cfg, cache["tokens"])
    loss, d_logits = L.cross_entropy(logits, y)
    return float(loss), logits, backward(params, cfg, cache, d_logits)
