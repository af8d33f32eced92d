"""The backward pass of :mod:`core.model.transformer`, by hand, step by step in reverse: the
readable track of training, for every setting of the one model (post- or pre-norm, LayerNorm or
RMSNorm, ReLU, GELU or SiLU, gated or not, any positions (rotary ones turned back inside
attention), grouped-query attention, tied or separate unembedding with or without its bias, a
final norm, biases on or off, causal or not, attention-only, a language model or a classifier)::

    loss, grads = loss_and_grads(params, cfg, tokens, targets)     # mean cross-entropy, its gradient
    grads = backward(params, cfg, cache, d_logits)                 # from a forward pass's cache

Each sublayer's backward pass sits beside its forward pass and reads what that left in the cache,
in the one vocabulary: attention's in :mod:`core.model.multi_head` (``attend_backward``: its
inputs, ``q``, ``k``, ``v``, ``weights``, ``concat``), the norms' in :mod:`core.model.norms`
(``normalized``, ``std``), the feed-forward network's in :mod:`core.model.transformer` (``input``,
``pre``, ``hidden``), the activations' in :mod:`core.model.activations`. This module runs them
block by block in reverse, through the residual wiring of :func:`core.model.norms.residual_backward`,
with the head and the embeddings at either end.
``grads`` has the parameters' names, shapes and dtype.
"""
from __future__ import annotations

import numpy as np

from core.model import config as C
from core.model import layers as L
from core.model import multi_head as MH
from core.model import names
from core.model import norms as N
from core.model import transformer as tr
from core.model.compact import wide
from core.model.config import TransformerConfig
from core.model.names import key
from core.model.positions import POSITIONS


# ----------------------------------------------------------------------------------------------
# one block, in reverse
# ----------------------------------------------------------------------------------------------
def block_backward(dh: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict, name: str):
    """``(d resid_pre, grads)`` of one block (:func:`transformer.block`) from ``d resid_post``;
    ``grads`` under the block's short names (``attn.W_Q``, ``ln1.g`` ...). Each sublayer's backward
    pass sits beside its forward pass and reads what that left in the cache."""
    g, w = {}, MH.weights(p, "attn")

    def attention_backward(d_out):                         # self-attention: x gave the queries, keys and values
        dq, dkv, g_attn = MH.attend_backward(d_out, w, cfg, cache, key(name, "attn"),
                                             rotary=POSITIONS[cfg.positional].rotates)
        g.update({f"attn.{n}": v for n, v in g_attn.items()})
        return dq + dkv

    def ffn_backward(dy):
        dx, g_ffn = tr.feed_forward_backward(dy, p, cfg, cache, key(name, "ffn"))
        g.update(g_ffn)
        return dx

    def norm_backward(part):                               # the norm ``part``'s, its gradients into g
        return lambda dy: N.backward(cfg, dy, p, part, cache, key(name, part), g)

    # 2. post-norm: h_out = LN2(h_mid + FFN(h_mid));  pre-norm: h_out = h_mid + FFN(LN2(h_mid))
    if cfg.d_ff:
        dh = N.residual_backward(dh, ffn_backward, norm_backward("ln2"), cfg.norm_placement)
    # 1. post-norm: h_mid = LN1(h_in + MHA(h_in));  pre-norm: h_mid = h_in + MHA(LN1(h_in))
    dh = N.residual_backward(dh, attention_backward, norm_backward("ln1"), cfg.norm_placement)
    return dh, g


# ----------------------------------------------------------------------------------------------
# the ends: the head (unembedding or classifier) and the embeddings
# ----------------------------------------------------------------------------------------------
def head_backward(d_logits: np.ndarray, params: dict, cfg: TransformerConfig, cache: dict, grads: dict, *,
                  h_last=None):
    """Gradient of the last block's output ``h_last`` (by default the cache's last ``resid_post``),
    from ``d_logits``, through the head and the final norm; the head's parameter gradients go
    into ``grads`` (a tied unembedding's share of ``embed`` under ``embed``)."""
    if h_last is None:
        h_last = cache[key(names.block(cfg.n_layers - 1), "resid_post")]     # (B, T, d)
    h = h_last
    if cfg.final_ln:                                                          # LN_final's output, from its cache
        h = cache["ln_final.normalized"] * params["ln_final.g"] + params.get("ln_final.b", 0)   # RMSNorm: no b
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
        dh = N.backward(cfg, dh, params, "ln_final", cache, "ln_final", grads)
    return dh


def embed_backward(dx: np.ndarray, params: dict, cfg: TransformerConfig, tokens: np.ndarray, grads: dict) -> None:
    """Scatter the gradient of ``embed[tokens] + positions`` into the embedding rows (added to a tied
    unembedding's share) and, for learned positions, the position rows."""
    d_embed = grads.get("embed", np.zeros_like(params["embed"]))
    np.add.at(d_embed, tokens.reshape(-1), dx.reshape(-1, cfg.d_model))       # a token seen twice adds twice
    grads["embed"] = d_embed
    POSITIONS[cfg.positional].backward(dx, params, "", grads)


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
    params = {name: wide(value) for name, value in params.items()}     # compact weights: their float values
    if np.shape(d_logits) != np.shape(cache["logits"]):
        raise ValueError(f"d_logits has shape {np.shape(d_logits)}; the logits have {np.shape(cache['logits'])}.")
    if cache[key(names.block(0), "attn", "weights")].shape[-1] != cache["tokens"].shape[1]:
        raise ValueError("This cache is from a KV-cached forward pass; the backward pass needs the whole sequence.")
    if "edited_heads" in cache:
        raise ValueError("This cache is from a forward pass with heads ablated or patched; the backward pass is "
                         "the unedited model's.")
    grads: dict[str, np.ndarray] = {}
    # 3. the head and the final LayerNorm
    dh = head_backward(d_logits, params, cfg, cache, grads)
    # 2. the blocks, last first
    for i in reversed(range(cfg.n_layers)):
        prefix = names.block(i) + "."
        dh, g = block_backward(dh, tr.block_params(params, prefix, widen=True), cfg, cache, names.block(i))
        grads.update({prefix + name: value for name, value in g.items()})
    # 1. the embeddings
    embed_backward(dh, params, cfg, cache["tokens"], grads)
    return {name: grads[name] for name in C.param_shapes(cfg)}


def trainable(cfg: TransformerConfig) -> None:
    """Refuse what the hand-written backward pass does not cover: BERT's settings run forward only."""
    extras = [name for name, value in (("head='none'", cfg.head == "none"), ("token types", cfg.n_token_types),
              ("an embedding LayerNorm", cfg.embed_ln), ("a pooler", cfg.pooler)) if value]
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
