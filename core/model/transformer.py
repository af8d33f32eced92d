"""One readable transformer whose architecture is settings, not copied code paths.

The same loop runs the original Transformer's decoder-only stack (post-norm, ReLU, sinusoidal
positions: the seeds), the GPT-2 family (pre-norm, GELU, learned positions, tied unembedding,
a final LayerNorm), the BERT family (post-norm, exact GELU, token types, a LayerNorm on the
embeddings, no causal mask, no head: it returns the last hidden states) and the Llama family
(pre-norm RMSNorm, the gated SiLU feed-forward network, rotary positions turned inside attention,
fewer key/value heads than query heads, no biases, tied unembedding: SmolLM2)::

    h = embed[tokens] + positions (+ token_type[types])            # (B, T, d)
    h = LN_embed(h)                                                # when embed_ln
    per block i, post-norm:   h = LN1(h + MHA(h));     h = LN2(h + FFN(h))
    per block i, pre-norm:    h = h + MHA(LN1(h));     h = h + FFN(LN2(h))
    h = LN_final(h)                                                # when final_ln
    head "lm":       logits = h @ unembed + unembed_b  (embed^T when tied)   # (B, T, V)
    head "classify": logits = mean_t(h) @ classifier.W + classifier.b        # (B, C)
    head "none":     the hidden states h themselves                           # (B, T, d)

``d_ff=0`` drops the feed-forward sublayer and its LayerNorm (attention-only). The seeds' encoder
classifier, the decoder-only and attention-only models and GPT-2 are all settings of this one model.
Each choice is a forward and a backward pass registered under its name: which norm ("LN" above:
LayerNorm or RMSNorm) and where it sits (:mod:`core.model.norms`, whose
:func:`~core.model.norms.residual` is the pre- and post-norm wiring of every block), which
activation (:mod:`core.model.activations`), which positions (:mod:`core.model.positions`).

A 2-D weight may be kept compact (:class:`~core.model.compact.CompactMatrix`, a quantised
checkpoint's form): one with a product of its own (GGUF's 4- and 8-bit blocks, in float32) is
multiplied as it is, by the linear layers and a tied unembedding; any other is widened when the
pass reaches its block (:func:`block_params`), the token table's rows for the tokens at hand, and a
tied unembedding a slice of the vocabulary at a time (:func:`tied_logits`), so the whole model is
never held as floats.

Parameters and the forward cache use the project's one vocabulary (``embed``, ``pos``,
``blocks.{i}.attn.W_Q`` ..., ``blocks.{i}.resid_pre``, ``blocks.{i}.attn.weights`` ...), so a
page reads what it draws from the cache instead of recomputing it; the names are built by
:mod:`core.model.names`. Attention, self or cross, is :func:`core.model.multi_head.attend`; the
feed-forward network is here, with its backward pass beside it, reading what its forward pass left
in the cache. The whole backward pass, block by block in reverse, is
:mod:`core.model.transformer_backward`.

At GPT-2's sizes a forward pass runs the tuned twins of its elementwise steps (the softmax, GELU,
SiLU, RMSNorm, the rotary turn, the KV cache; :mod:`core.model.tuned.forward`): :func:`runs_tuned`
decides once, at the top of the pass, and every sublayer is handed that choice. Such a pass also
multiplies a layer's query, key and value weights as one product where they have one (a quantised
checkpoint's), and when it keeps neither the attention scores nor the weights (``keep=``), each
head's attention runs without them, as does a SwiGLU layer that keeps none of its gate's steps.
"""
from __future__ import annotations

import numpy as np

from core.model import layers as L
from core.model import multi_head as MH
from core.model import names
from core.model import norms as N
from core.model.activations import ACTIVATIONS
from core.model.compact import CompactMatrix, for_products, wide
from core.model.config import TransformerConfig, check_params, check_tokens
from core.model.names import key
from core.model.norms import layer_norm, layer_norm_backward  # noqa: F401  (the pages show them as the model's)
from core.model.params import whole
from core.model.positions import POSITIONS
from core.model.tuned import forward as TF


# ----------------------------------------------------------------------------------------------
# the readable steps or their tuned twins: one choice per forward pass
# ----------------------------------------------------------------------------------------------
def runs_tuned(cfg: TransformerConfig, dtype) -> bool:
    """Whether a forward pass runs the tuned twins (:mod:`core.model.tuned.forward`): at GPT-2's sizes
    (a ``d x d`` weight of at least ``BLAS_FROM`` numbers, which BLAS multiplies), once they are
    compiled. Decided once at the top of a forward pass and handed to every sublayer.

    Every setting runs them: the softmax's rows and the KV cache's buffer do not depend on the
    kind of model (grouped-query attention caches its ``H_kv`` heads, rotary positions their turned
    keys); an activation without a twin (ReLU, exact GELU) runs its readable form."""
    return cfg.d_model ** 2 >= L.BLAS_FROM and TF.ready(dtype)


# ----------------------------------------------------------------------------------------------
# the feed-forward network (attention is multi_head.attend), with its backward beside it
# ----------------------------------------------------------------------------------------------
def feed_forward(x: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict, name: str, *,
                 tuned: bool = False) -> np.ndarray:
    """``act(x W_1 + b_1) W_2 + b_2``, ``act`` the model's activation (ReLU, GELU exact or its tanh
    form, SiLU: :data:`~core.model.activations.ACTIVATIONS`); gated (``cfg.gated_ffn``, Llama's
    SwiGLU), ``(act(x W_gate + b_gate) * (x W_1 + b_1)) W_2 + b_2``. Its ``{name}.input``, the hidden
    layer ``{name}.pre`` (``x W_1 + b_1``) and ``{name}.hidden`` (what ``W_2`` reads), gated also
    ``{name}.gate`` (``x W_gate + b_gate``) and ``{name}.gate_act`` (its activation), and its
    ``{name}.output`` go to the cache."""
    cache[key(name, "input")] = x
    # a tuned pass that keeps none of the hidden layer's steps: SwiGLU as one product, or the activation
    # applied inside W_1's product, where there is one
    hidden = None
    if tuned and cfg.gated_ffn and cfg.activation == "silu" and p.get("ffn.b_gate") is None and p.get("ffn.b_1") is None \
            and not any(MH.keeps(cache, key(name, part)) for part in ("pre", "gate", "gate_act")):
        hidden = L.dense_joined(x, (p["ffn.W_gate"], p["ffn.W_1"]), gated=True)
    elif tuned and not cfg.gated_ffn and not MH.keeps(cache, key(name, "pre")):
        hidden = L.dense_activated(x, p["ffn.W_1"], p.get("ffn.b_1"), cfg.activation)   # act fused into the product
    if hidden is None:
        cache[key(name, "pre")] = pre = L.dense(x, p["ffn.W_1"], p.get("ffn.b_1"))      # (B, T, d_ff)
        act = ACTIVATIONS[cfg.activation].forward
        if cfg.gated_ffn:
            cache[key(name, "gate")] = gate = L.dense(x, p["ffn.W_gate"], p.get("ffn.b_gate"))   # (B, T, d_ff)
            cache[key(name, "gate_act")] = gate_act = act(gate, tuned)
            hidden = gate_act * pre
        else:
            hidden = act(pre, tuned)
    cache[key(name, "hidden")] = hidden
    cache[key(name, "output")] = out = L.dense(hidden, p["ffn.W_2"], p.get("ffn.b_2"))  # (B, T, d)
    return out


def feed_forward_backward(dy: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict, name: str):
    """``(dx, grads)`` of :func:`feed_forward` ``name``, from its cache."""
    g = {}
    x, pre, hidden = cache[key(name, "input")], cache[key(name, "pre")], cache[key(name, "hidden")]   # (B, T, d_ff)
    d_hidden, g["ffn.W_2"], g["ffn.b_2"] = L.linear_backward(dy, hidden, p["ffn.W_2"])
    act = ACTIVATIONS[cfg.activation].backward
    if cfg.gated_ffn:                          # hidden = act(gate) * pre: each factor's gradient is the other's
        gate, gate_act = cache[key(name, "gate")], cache[key(name, "gate_act")]
        d_gate = act(d_hidden * pre, gate, gate_act)
        d_pre = d_hidden * gate_act
        dx_gate, g["ffn.W_gate"], g["ffn.b_gate"] = L.linear_backward(d_gate, x, p["ffn.W_gate"])
    else:
        d_pre = act(d_hidden, pre, hidden)
    dx, g["ffn.W_1"], g["ffn.b_1"] = L.linear_backward(d_pre, x, p["ffn.W_1"])
    if cfg.gated_ffn:
        dx += dx_gate
    return dx, {k: v for k, v in g.items() if cfg.bias or ".W_" in k}


# ----------------------------------------------------------------------------------------------
# one block, the whole stack
# ----------------------------------------------------------------------------------------------
def block(h: np.ndarray, p: dict, cfg: TransformerConfig, cache: dict, name: str, *,
          kv: dict | None = None, start: int = 0, edits=None, layer: int = 0, key_mask=None,
          tuned: bool = False) -> np.ndarray:
    """One block on ``h (B, T, d)``, its parameters ``p`` under short names (``attn.W_Q`` ...);
    what it computes goes to the cache under ``{name}.`` (``blocks.3.resid_mid`` ...)."""
    w = MH.weights(p, "attn")

    def attention(x):                                     # self-attention, causal in a decoder
        return MH.attend(x, x, w, cfg, cache, key(name, "attn"), causal=cfg.causal, kv=kv, start=start,
                         edits=edits, layer=layer, key_mask=key_mask, rotary=POSITIONS[cfg.positional].rotates,
                         tuned=tuned)

    def ffn(x):
        return feed_forward(x, p, cfg, cache, key(name, "ffn"), tuned=tuned)

    def norm(part):                                       # the model's norm (LayerNorm, RMSNorm) ``part``
        return lambda x: N.forward(cfg, x, p, part, cache, key(name, part), tuned)

    cache[key(name, "resid_pre")] = h
    # 1. post-norm: h = LN1(h + MHA(h));  pre-norm: h = h + MHA(LN1(h))
    h = N.residual(h, attention, norm("ln1"), cfg.norm_placement)
    cache[key(name, "resid_mid")] = h
    # 2. post-norm: h = LN2(h + FFN(h));  pre-norm: h = h + FFN(LN2(h))   (none in an attention-only model)
    if cfg.d_ff:
        h = N.residual(h, ffn, norm("ln2"), cfg.norm_placement)
    cache[key(name, "resid_post")] = h
    return h


def block_params(params: dict, prefix: str, *, widen: bool = False) -> dict:
    """The parameters under ``prefix`` (``blocks.3.``) by their short names (``attn.W_Q`` ...), as
    a forward pass multiplies them: a compact weight (:class:`~core.model.compact.CompactMatrix`) that
    has a product of its own stays compact, any other is widened here, when the pass reaches its
    block, and dropped with the block's dict after it. ``widen``: every one widened (a backward pass)."""
    keep = wide if widen else for_products
    return {name[len(prefix):]: keep(value) for name, value in params.items() if name.startswith(prefix)}


def token_rows(table, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of a token table (``embed``, ``token_type``): ``ids.shape + (d,)``; a compact
    table widens those rows only."""
    return table.rows(ids) if isinstance(table, CompactMatrix) else table[ids]


# The tied unembedding of a compact token table is widened this many rows (tokens) at a time:
# SmolLM2's 49,152 x 576 table would take 113 MB as float32, a slice of 8,192 takes 19 MB.
VOCAB_SLICE = 8192


def tied_logits(h: np.ndarray, table) -> np.ndarray:
    """``h @ embed^T`` (B, T, V) for the token table ``embed`` (V, d), one slice of ``VOCAB_SLICE``
    tokens at a time: a compact table is never widened whole. A float table takes the same slices
    (views), so the two give the same bits."""
    x = h.reshape(-1, h.shape[-1])                                                         # (N, d)
    logits = table.product(x, transposed=True) if isinstance(table, CompactMatrix) else None   # read compact
    if logits is not None:
        return logits.reshape(*h.shape[:-1], table.shape[0])
    E_T = L.packed(table, transposed=True)           # a loaded model's table, packed as E^T at load
    logits = None if E_T is None else L.packed_product(x, E_T)
    if logits is not None:
        return logits.reshape(*h.shape[:-1], E_T.shape[1])
    V, big = table.shape[0], table.shape[0] * table.shape[1] >= L.BLAS_FROM
    logits = np.empty((x.shape[0], V), dtype=h.dtype)
    for a in range(0, V, VOCAB_SLICE):
        b = min(a + VOCAB_SLICE, V)
        rows = table.rows(np.arange(a, b)) if isinstance(table, CompactMatrix) else table[a:b]   # (b - a, d)
        logits[:, a:b] = L.product(x, rows.T, big)
    return logits.reshape(*h.shape[:-1], V)


def embed(params: dict, cfg: TransformerConfig, tokens: np.ndarray, start: int = 0, prefix: str = "",
          cache: dict | None = None, token_types: np.ndarray | None = None) -> np.ndarray:
    """``embed[tokens] + positions[start:start+T]`` for ``tokens (B, T)``; the two terms go to
    ``{prefix}token_embed`` (B, T, d) and ``{prefix}pos_embed`` (T, d) in ``cache`` when one is given.
    A model with token types (BERT's segments A and B) adds ``token_type[token_types]`` (all type 0
    when none are given), and one with ``embed_ln`` puts the sum through the model's norm (BERT's LayerNorm)."""
    x = token_rows(params[f"{prefix}embed"], tokens)                                     # (B, T, d)
    pos = POSITIONS[cfg.positional].table(params, cfg, prefix, start, tokens.shape[1], x.dtype)   # (T, d)
    if cache is not None:
        cache[f"{prefix}token_embed"], cache[f"{prefix}pos_embed"] = x, pos
    h = x + pos
    if cfg.n_token_types:
        types = np.zeros_like(tokens) if token_types is None else token_types
        h = h + token_rows(params[f"{prefix}token_type"], types)                          # (B, T, d)
    if cfg.embed_ln:
        h = N.forward(cfg, h, params, f"{prefix}embed_ln", {} if cache is None else cache, f"{prefix}embed_ln")
    return h


def unembed(params: dict, cfg: TransformerConfig, h: np.ndarray, cache: dict, prefix: str = "") -> np.ndarray:
    """The final norm (when the model has one), then the head: the unembedding, ``logits
    (B, T, V)``, the classifier on the mean over positions, ``logits (B, C)`` (``pooled`` (B, d)
    goes to the cache), or none: the hidden states ``(B, T, d)``. BERT's pooler, when the model has
    one, leaves ``pooler.output = tanh(h[:, 0] W + b)`` (B, d) in the cache."""
    if cfg.final_ln:
        h = N.forward(cfg, h, params, f"{prefix}ln_final", cache, f"{prefix}ln_final")
    if cfg.pooler:
        cache[f"{prefix}pooler.output"] = np.tanh(L.dense(h[:, 0], wide(params[f"{prefix}pooler.W"]),
                                                        params[f"{prefix}pooler.b"]))
    if cfg.head == "none":
        return h
    if cfg.head == "classify":
        cache[f"{prefix}pooled"] = pooled = h.mean(axis=1)                               # (B, d)
        return L.dense(pooled, wide(params[f"{prefix}classifier.W"]), params[f"{prefix}classifier.b"])
    if cfg.tied_unembed:                                                                  # embed^T, a slice at a time
        logits = tied_logits(h, params[f"{prefix}embed"])                                 # (B, T, V)
        bias = params.get(f"{prefix}unembed_b")
        return logits if bias is None else logits + bias
    return L.dense(h, wide(params[f"{prefix}unembed"]), params.get(f"{prefix}unembed_b"))   # one 2-D product


def forward(params: dict, cfg: TransformerConfig, tokens, *, ablate: dict | None = None,
            kv: list | None = None, start: int = 0, token_types=None, key_mask=None, keep=None):
    """The forward pass: ``(logits (B, T, V), cache)``.

    Parameters
    ----------
    tokens : ids ``(T,)`` or ``(B, T)``
    ablate : ``{(layer, head): "zero" | "mean" | array}``: edit those heads' outputs before
        ``W_O`` (zero or mean ablation, or a patch such as the head's output on another prompt,
        ``(T, d_k)`` or ``(B, T, d_k)``); see :func:`core.model.multi_head.edit_heads`.
    kv : a KV cache, one dict per block (``[{} for _ in range(n_layers)]`` to start), filled in
        place; ``start`` is the position of the first of ``tokens`` (the cache's length).
    token_types : ``(B, T)`` segment ids, for a model with ``n_token_types`` (default: all 0)
    key_mask : ``(B, T)``, 1 for a real token and 0 for padding (``transformers``' ``attention_mask``):
        no query attends to a padding key. Each sequence needs at least one real token.
    keep : the entries of each block's cache to keep (``("attn.weights",)``); None keeps them all.
        Entries outside the blocks are always kept. A big model's pass keeps what its reader needs:
        SmolLM2's whole cache of four sequences of 41 tokens is 260 MB, mostly feed-forward activations.

    Returns
    -------
    logits : (B, T, V), (B, C) for a classifier, or the last hidden states (B, T, d) for ``head="none"``
    cache : flat dict: ``tokens`` (B, T), ``token_embed`` (B, T, d), ``pos_embed`` (T, d), ``blocks.{i}.resid_pre``, ``blocks.{i}.ln1.input|mean|std|
        normalized``, ``blocks.{i}.attn.scores|weights|head_outputs|concat|output``,
        ``blocks.{i}.resid_mid``, ``blocks.{i}.ln2.*``, ``blocks.{i}.ffn.pre|hidden|output`` (gated also
        ``gate|gate_act``; rotary positions add ``blocks.{i}.attn.q_unrotated|k_unrotated``),
        ``blocks.{i}.resid_post``, ``ln_final.*``, ``pooled`` (a classifier), ``logits``. Without ablations or a KV
        cache it is all that :func:`core.model.transformer_backward.backward` needs.
    """
    check_params(params, cfg)
    return forward_checked(params, cfg, tokens, ablate=ablate, kv=kv, start=start, token_types=token_types,
                           key_mask=key_mask, keep=keep)


class _BlockEntriesKept(dict):
    """A forward cache that stores, of each block's entries, only those named in ``keep``."""

    def __init__(self, keep):
        super().__init__()
        if isinstance(keep, str) or not all(isinstance(name, str) for name in keep):
            raise ValueError(f"keep names a block's cache entries, as in keep=('attn.weights',); got {keep!r}.")
        self.keep = frozenset(keep)

    def keeps(self, name: str) -> bool:
        return not name.startswith("blocks.") or name.split(".", 2)[2] in self.keep

    def __setitem__(self, name, value):
        if self.keeps(name):
            super().__setitem__(name, value)


def forward_checked(params: dict, cfg: TransformerConfig, tokens, *, ablate: dict | None = None,
                    kv: list | None = None, start: int = 0, token_types=None, key_mask=None, keep=None):
    """:func:`forward` for parameters the caller has already passed through :func:`check_params`.

    For generation, which checks the parameters once and then runs one step per token: the check
    took 23 us of a tiny GPT's 440 us per token. Everything else (tokens, edits, cache) is checked here.
    """
    tokens = check_tokens(tokens, cfg, start)
    _check_edits(ablate, cfg, tokens.shape)
    if kv is not None and len(kv) != cfg.n_layers:
        raise ValueError(f"kv must hold one dict per block ({cfg.n_layers}), got {len(kv)}.")
    types = check_token_types(token_types, cfg, tokens.shape)
    additive = key_mask_scores(key_mask, tokens.shape, params["embed"].dtype, kv is not None)   # (B, 1, 1, T)
    cache: dict[str, np.ndarray] = {} if keep is None else _BlockEntriesKept(keep)
    cache["tokens"] = tokens
    if ablate:
        cache["edited_heads"] = np.array(sorted(ablate), dtype=np.int64)                # (n, 2): layer, head
    tuned = runs_tuned(cfg, params["embed"].dtype)               # the readable steps or their tuned twins
    h = embed(params, cfg, tokens, start, cache=cache, token_types=types)                # (B, T, d)
    for i in range(cfg.n_layers):
        p = block_params(params, names.block(i) + ".")          # this block's weights (compact ones as they multiply)
        h = block(h, p, cfg, cache, names.block(i), kv=None if kv is None else kv[i], start=start, edits=ablate,
                  layer=i, key_mask=additive, tuned=tuned)
    logits = unembed(params, cfg, h, cache)
    cache["logits"] = logits
    return logits, cache


def per_token(values, shape, name: str) -> np.ndarray:
    """One value per token, ``(B, T)`` as the tokens are (a 1-D ``(T,)`` is one sequence)."""
    values = np.asarray(values)
    values = values[None, :] if values.ndim == 1 else values
    if values.shape != tuple(shape):
        raise ValueError(f"{name} must have the tokens' shape {tuple(shape)}, got {values.shape}.")
    return values


def check_token_types(token_types, cfg: TransformerConfig, shape) -> np.ndarray | None:
    """Segment ids as int64 ``(B, T)``, each below ``n_token_types``; None stays None (all type 0)."""
    if token_types is None:
        return None
    if not cfg.n_token_types:
        raise ValueError("This model has no token types (segments); leave token_types out.")
    types = per_token(token_types, shape, "token_types")
    if not np.issubdtype(types.dtype, np.integer) or types.size and (types.min() < 0 or types.max() >= cfg.n_token_types):
        raise ValueError(f"token_types must be whole numbers from 0 to {cfg.n_token_types - 1}.")
    return types.astype(np.int64)


def key_mask_scores(key_mask, shape, dtype, with_kv: bool = False) -> np.ndarray | None:
    """``transformers``' ``attention_mask`` (1 = a token, 0 = padding), ``(B, T)``, as the additive mask
    the scores take: ``(B, 1, 1, T)``, 0 where a key may be seen and ``-inf`` where not."""
    if key_mask is None:
        return None
    if with_kv:
        raise ValueError("A key mask and a KV cache cannot be combined: pad nothing when generating.")
    keep = per_token(key_mask, shape, "key_mask")
    if not np.isin(keep, (0, 1)).all():
        raise ValueError("key_mask holds 1 for a token and 0 for padding, nothing else.")
    if not keep.any(axis=1).all():
        raise ValueError("Every sequence needs at least one token that is not padding.")
    return np.where(keep.astype(bool), 0.0, -np.inf).astype(dtype)[:, None, None, :]


def _check_edits(edits, cfg: TransformerConfig, shape) -> None:
    if not edits:
        return
    if not isinstance(edits, dict):
        raise ValueError("ablate must be a dict {(layer, head): 'zero' | 'mean' | array}.")
    for head, how in edits.items():
        if not (isinstance(head, tuple) and len(head) == 2 and all(whole(k) for k in head)
                and 0 <= head[0] < cfg.n_layers and 0 <= head[1] < cfg.n_heads):
            raise ValueError(f"ablate keys are (layer, head) with layer in 0..{cfg.n_layers - 1} and "
                             f"head in 0..{cfg.n_heads - 1}; got {head!r}.")
        if isinstance(how, str):
            if how not in MH.ABLATIONS:
                raise ValueError(f"A head is ablated with 'zero' or 'mean' or patched with an array, got {how!r}.")
            continue
        value = np.asarray(how)
        if value.shape not in ((shape[1], cfg.d_k), (shape[0], shape[1], cfg.d_k)):
            raise ValueError(f"A patch for head {head} must have shape ({shape[1]}, {cfg.d_k}) "
                             f"(positions, head width), got {value.shape}.")
