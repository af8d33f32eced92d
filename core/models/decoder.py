"""The decoder: an encoder-decoder and a decoder-only language model, with a hand-written backward
pass and generation one token at a time through a KV cache.

Architecture (the original Transformer: post-norm, ReLU, no dropout)::

    encoder (cross_attention=True only), on the source ids src (B, S):
        m = enc.embed[src] + PE                                   # (B, S, d)
        per layer:  m = LN1(m + MHA(m))
                    m = LN2(m + FFN(m))
    decoder, on the target ids tgt_in (B, T) (teacher forcing: the target shifted right):
        x = dec.embed[tgt_in] + PE                                # (B, T, d)
        per layer:  x = LN1(x + MHA(x, causal mask))              # masked self-attention
                    x = LN_cross(x + MHA(x, over m))              # cross-attention (encoder-decoder only)
                    x = LN2(x + FFN(x))
        logits = x W_out + b_out                                  # (B, T, V)
    loss = mean cross-entropy over every target position

Cross-attention takes its queries from the decoder and its keys and values from the encoder's
output ``m`` (the "memory"). A decoder-only layer is an encoder layer with a causal mask.

Parameters are a ``dict[str, np.ndarray]`` (names and shapes in :func:`param_shapes`) computed in
their own dtype, float32 or float64. Encoder layers use the encoder's names under ``enc.``
(``enc.layers.{i}.W_Q`` ...); decoder layers use the same names under ``dec.`` plus
``cross_W_Q ... cross_b_O`` and ``ln_cross_g, ln_cross_b`` for cross-attention.

Generation: with ``use_cache=True`` the prompt runs through the decoder once (filling the KV
cache), then each new token runs alone, its query attending over the cached keys and values of
every earlier position: O(T) work per token. With ``use_cache=False`` every step recomputes the
full causal forward pass over the whole prefix, O(T^2) work per token, and gives the same logits.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from core.models import decoder_step, sampling
from core.models import layers as L
from core.validate import check_heads

POSITIONAL_CHOICES = ("sinusoidal", "learned", "none")
ATTENTION = L.ATTENTION_PARAMS                     # W_Q W_K W_V W_O b_Q b_K b_V b_O
LAYER_PARAMS = ATTENTION + ("ln1_g", "ln1_b", "W_1", "b_1", "W_2", "b_2", "ln2_g", "ln2_b")
CROSS_PARAMS = tuple(f"cross_{name}" for name in ATTENTION) + ("ln_cross_g", "ln_cross_b")
FFN_PARAMS = ("W_1", "b_1", "W_2", "b_2", "ln2_g", "ln2_b")      # absent when d_ff == 0


# ----------------------------------------------------------------------------------------------
# configuration and parameters
# ----------------------------------------------------------------------------------------------
def _whole(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the model; checked on creation (``ValueError`` in the user's terms).

    ``cross_attention=True`` builds an encoder-decoder, which needs ``src_vocab_size`` and
    ``src_len`` (the longest source); ``False`` builds a decoder-only language model, which has
    no source. ``tgt_len`` is the decoder's context: the most target positions it reads.
    ``bos_id``, optional, is the start token generation begins with when no prompt is given.
    ``d_ff=0`` drops the feed-forward sublayer (and its LayerNorm) from every layer: an
    attention-only model, whose layers are ``x = LN1(x + MHA(x))``.
    """

    vocab_size: int
    tgt_len: int
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    cross_attention: bool = True
    src_vocab_size: int | None = None
    src_len: int | None = None
    positional: str = "sinusoidal"
    ln_eps: float = 1e-5
    bos_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "tgt_len", "d_model", "n_heads", "d_ff", "n_layers"):
            value = getattr(self, name)
            if name == "d_ff" and _whole(value) and value == 0:
                continue                                    # attention-only: no feed-forward sublayer
            if not _whole(value) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        check_heads(self.d_model, self.n_heads)
        if not isinstance(self.cross_attention, (bool, np.bool_)):
            raise ValueError(f"cross_attention must be True (encoder-decoder) or False (decoder-only), "
                             f"got {self.cross_attention!r}.")
        if self.cross_attention:
            for name in ("src_vocab_size", "src_len"):
                value = getattr(self, name)
                if not _whole(value) or value < 1:
                    raise ValueError(f"An encoder-decoder (cross_attention=True) needs {name}, a positive "
                                     f"whole number, got {value!r}.")
        elif self.src_vocab_size is not None or self.src_len is not None:
            raise ValueError("A decoder-only model (cross_attention=False) has no source: leave "
                             "src_vocab_size and src_len unset.")
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL_CHOICES)}, "
                             f"got {self.positional!r}.")
        if not (isinstance(self.ln_eps, (int, float)) and math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a small positive number, got {self.ln_eps!r}.")
        if self.bos_id is not None and not (_whole(self.bos_id) and 0 <= self.bos_id < self.vocab_size):
            raise ValueError(f"bos_id must be a token id in 0..{self.vocab_size - 1} (or None), got {self.bos_id!r}.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


def _layer_shapes(cfg: DecoderConfig, cross: bool) -> dict[str, tuple[int, ...]]:
    d, F = cfg.d_model, cfg.d_ff
    shapes = {name: (d, d) for name in ("W_Q", "W_K", "W_V", "W_O")}
    shapes.update({name: (d,) for name in ("b_Q", "b_K", "b_V", "b_O", "ln1_g", "ln1_b", "ln2_g", "ln2_b")})
    shapes.update({"W_1": (d, F), "b_1": (F,), "W_2": (F, d), "b_2": (d,)})
    names = list(LAYER_PARAMS)
    if cfg.d_ff == 0:                                   # attention-only: no W_1 ... b_2, no ln2
        names = [name for name in names if name not in FFN_PARAMS]
    if cross:
        shapes.update({f"cross_{name}": shapes[name] for name in ATTENTION})
        shapes.update({"ln_cross_g": (d,), "ln_cross_b": (d,)})
        names[10:10] = CROSS_PARAMS                     # in the order the sublayers run: after ln1
    return {name: shapes[name] for name in names}


def param_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order (encoder, decoder, output)."""
    d = cfg.d_model
    shapes: dict[str, tuple[int, ...]] = {}
    stacks = [("enc.", cfg.src_vocab_size, cfg.src_len, False)] if cfg.cross_attention else []
    stacks.append(("dec.", cfg.vocab_size, cfg.tgt_len, cfg.cross_attention))
    for prefix, vocab, length, cross in stacks:
        shapes[f"{prefix}embed"] = (vocab, d)
        if cfg.positional == "learned":
            shapes[f"{prefix}pos"] = (length, d)
        for i in range(cfg.n_layers):
            for name, shape in _layer_shapes(cfg, cross).items():
                shapes[f"{prefix}layers.{i}.{name}"] = shape
    shapes["W_out"] = (d, cfg.vocab_size)
    shapes["b_out"] = (cfg.vocab_size,)
    return shapes


def param_count(cfg: DecoderConfig) -> int:
    """Number of trainable numbers in the model."""
    return int(sum(math.prod(s) for s in param_shapes(cfg).values()))


def init_params(cfg: DecoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters, deterministic for a seed: weights ``N(0, 1/d_in)``, embeddings
    ``N(0, 1)``, learned positions ``N(0, 0.1^2)``, biases 0, layer-norm gains 1."""
    return L.init_by_name(param_shapes(cfg), seed, dtype)


def check_params(params: dict, cfg: DecoderConfig) -> np.dtype:
    """Refuse missing, misshaped, mixed-precision or non-finite parameters; return their dtype."""
    if not isinstance(params, dict):
        raise ValueError("params must be a dict of arrays, as init_params returns.")
    shapes = param_shapes(cfg)
    missing = [name for name in shapes if name not in params]
    if missing:
        raise ValueError(f"params lacks {len(missing)} parameter(s) this configuration needs, e.g. "
                         f"{', '.join(missing[:3])}.")
    extra = [name for name in params if name not in shapes]
    if extra:
        raise ValueError(f"params has parameter(s) this configuration does not use, e.g. {', '.join(extra[:3])}.")
    dtype = np.asarray(params["W_out"]).dtype
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype}.")
    for name, shape in shapes.items():
        value = params[name]
        if not isinstance(value, np.ndarray) or value.dtype != dtype:
            raise ValueError(f"Parameter {name} must be a {dtype} array like the others.")
        if value.shape != shape:
            raise ValueError(f"Parameter {name} has shape {value.shape}, the configuration needs {shape}.")
        if not np.isfinite(value).all():
            raise ValueError(f"Parameter {name} contains NaN or infinity.")
    return dtype


def check_tokens(tokens, vocab_size: int, max_len: int, what: str) -> np.ndarray:
    """Token ids ``(T,)`` or ``(B, T)`` -> int64 ``(B, T)``; ids in ``0..vocab_size-1``, ``1 <= T <= max_len``."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        raise ValueError(f"{what} is empty: give at least one token.")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be whole-number token ids, got values of type {arr.dtype}.")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{what} must be one sequence (T,) or a batch (B, T), got shape {np.shape(tokens)}.")
    if arr.shape[1] > max_len:
        raise ValueError(f"{what} has {arr.shape[1]} positions, longer than the model's context of {max_len}.")
    if arr.min() < 0 or arr.max() >= vocab_size:
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise ValueError(f"{what} holds the id {bad}, outside the vocabulary 0..{vocab_size - 1}.")
    return arr.astype(np.int64)


def _check_pair(cfg: DecoderConfig, tgt, src):
    """Checked ``(tgt (B, T), src (B, S) or None)``; whether the caller passed one sequence."""
    single = np.ndim(tgt) == 1
    tgt = check_tokens(tgt, cfg.vocab_size, cfg.tgt_len, "The target")
    if not cfg.cross_attention:
        if src is not None:
            raise ValueError("This is a decoder-only model (cross_attention=False): it takes no source.")
        return tgt, None, single
    if src is None:
        raise ValueError("This encoder-decoder needs a source sequence (src).")
    if (np.ndim(src) == 1) != single:
        raise ValueError("Give the source and the target both as one sequence or both as a batch.")
    src = check_tokens(src, cfg.src_vocab_size, cfg.src_len, "The source")
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"The source has {src.shape[0]} sequences and the target {tgt.shape[0]}.")
    return tgt, src, single


# ----------------------------------------------------------------------------------------------
# the forward pass, teacher forcing
# ----------------------------------------------------------------------------------------------
def _embed(params: dict, prefix: str, tokens: np.ndarray, cfg: DecoderConfig, start: int = 0) -> np.ndarray:
    """``embed[tokens] + PE[start:start+T]`` for ``tokens (B, T)`` at positions ``start..start+T-1``."""
    x = params[f"{prefix}embed"][tokens]                                   # (B, T, d)
    T = tokens.shape[1]
    if cfg.positional == "learned":
        return x + params[f"{prefix}pos"][start:start + T]
    if cfg.positional == "sinusoidal":
        length = cfg.tgt_len if prefix == "dec." else cfg.src_len
        return x + L.sinusoid_table(length, cfg.d_model, x.dtype.str)[start:start + T]
    return x


def _causal_mask(n_new: int, start: int, dtype) -> np.ndarray:
    """``(n_new, start + n_new)``: query ``i`` (at position ``start + i``) sees keys ``j <= start + i``."""
    return np.triu(np.full((n_new, start + n_new), -np.inf, dtype=dtype), k=start + 1)


def _sub(params: dict, prefix: str, names) -> dict:
    """The parameters ``prefix + name`` under their short names (``cross_`` dropped); names the
    configuration lacks (the feed-forward ones when ``d_ff == 0``) are left out."""
    return {name.removeprefix("cross_"): params[prefix + name] for name in names if prefix + name in params}


def _encoder_layer(h: np.ndarray, p: dict, cfg: DecoderConfig):
    """One post-norm encoder layer on ``h (B, S, d)``: ``(h_out, cache)``."""
    c = {}
    # 1. self-attention over the whole source, residual, norm
    a, c["attn"] = L.attention(h, h, p, cfg.n_heads)
    h1, c["ln1"] = L.layer_norm(h + a, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    # 2. feed-forward, residual, norm (none in an attention-only model)
    if cfg.d_ff == 0:
        return h1, c
    f, c["ffn"] = L.feed_forward(h1, p)
    h2, c["ln2"] = L.layer_norm(h1 + f, p["ln2_g"], p["ln2_b"], cfg.ln_eps)
    return h2, c


def _decoder_layer(x: np.ndarray, memory, p: dict, pc, cfg: DecoderConfig, mask: np.ndarray):
    """One post-norm decoder layer on ``x (B, T, d)`` (``memory (B, S, d)`` and the cross-attention
    parameters ``pc`` are None for a decoder-only model): ``(x_out, cache)``."""
    c = {}
    # 1. masked self-attention, residual, norm
    a, c["self"] = L.attention(x, x, p, cfg.n_heads, mask)
    x, c["ln1"] = L.layer_norm(x + a, p["ln1_g"], p["ln1_b"], cfg.ln_eps)
    # 2. cross-attention: queries from the decoder, keys and values from the encoder's output
    if memory is not None:
        a, c["cross"] = L.attention(x, memory, pc, cfg.n_heads)
        x, c["ln_cross"] = L.layer_norm(x + a, pc["ln_cross_g"], pc["ln_cross_b"], cfg.ln_eps)
    # 3. feed-forward, residual, norm (none in an attention-only model)
    if cfg.d_ff == 0:
        return x, c
    f, c["ffn"] = L.feed_forward(x, p)
    x, c["ln2"] = L.layer_norm(x + f, p["ln2_g"], p["ln2_b"], cfg.ln_eps)
    return x, c


def _encode(params: dict, cfg: DecoderConfig, src: np.ndarray):
    """The encoder's output ``memory (B, S, d)`` and its layers' caches."""
    h = _embed(params, "enc.", src, cfg)                                   # (B, S, d)
    caches = []
    for i in range(cfg.n_layers):
        h, c = _encoder_layer(h, _sub(params, f"enc.layers.{i}.", LAYER_PARAMS), cfg)
        caches.append(c)
    return h, caches


def _decode(params: dict, cfg: DecoderConfig, tgt_in: np.ndarray, memory):
    """Teacher-forced decoder: ``logits (B, T, V)``, final hidden states and the layers' caches."""
    x = _embed(params, "dec.", tgt_in, cfg)                                # (B, T, d)
    mask = _causal_mask(tgt_in.shape[1], 0, x.dtype)                       # (T, T)
    caches = []
    for i in range(cfg.n_layers):
        prefix = f"dec.layers.{i}."
        pc = _sub(params, prefix, CROSS_PARAMS) if memory is not None else None
        x, c = _decoder_layer(x, memory, _sub(params, prefix, LAYER_PARAMS), pc, cfg, mask)
        caches.append(c)
    logits = L.linear(x, params["W_out"], params["b_out"])                # (B, T, V)
    return logits, x, caches


def _forward(params: dict, cfg: DecoderConfig, tgt_in: np.ndarray, src):
    """Forward pass on checked int64 ``(B, T)`` / ``(B, S)`` ids: ``(logits, cache)``."""
    cache = {"tgt_in": tgt_in, "src": src}
    memory = None
    if cfg.cross_attention:
        memory, cache["enc_layers"] = _encode(params, cfg, src)
        cache["memory"] = memory
        cache["enc_attn"] = np.stack([c["attn"]["weights"] for c in cache["enc_layers"]])   # (L, B, H, S, S)
    logits, hidden, cache["dec_layers"] = _decode(params, cfg, tgt_in, memory)
    cache["self_attn"] = np.stack([c["self"]["weights"] for c in cache["dec_layers"]])      # (L, B, H, T, T)
    if cfg.cross_attention:
        cache["cross_attn"] = np.stack([c["cross"]["weights"] for c in cache["dec_layers"]])  # (L, B, H, T, S)
    cache["hidden"], cache["logits"] = hidden, logits
    return logits, cache


def forward(params: dict, cfg: DecoderConfig, tgt_in, src=None):
    """Teacher-forced forward pass with a causal mask.

    Parameters
    ----------
    params : dict from :func:`init_params`
    cfg : DecoderConfig
    tgt_in : (B, T) or (T,) int
        The decoder's input: the target shifted right (``T <= cfg.tgt_len``).
    src : (B, S) or (S,) int, encoder-decoder only
        The source (``S <= cfg.src_len``).

    Returns
    -------
    logits : (B, T, V)
        ``logits[b, t]`` scores the token after ``tgt_in[b, :t+1]``; it depends on no later position.
    cache : dict
        ``self_attn`` (L, B, H, T, T): each decoder layer's masked self-attention weights (zero above
        the diagonal); ``cross_attn`` (L, B, H, T, S) and ``enc_attn`` (L, B, H, S, S) for an
        encoder-decoder; ``memory`` (B, S, d), the encoder's output; ``hidden`` (B, T, d), the
        decoder's last hidden states; ``logits``; and each layer's sublayer caches
        (``dec_layers``, ``enc_layers``: ``scores``, ``weights``, ``head_outputs``, ``concat``,
        ``output`` per attention) for the backward pass. With one sequence in, the batch axis is
        dropped from ``logits`` and from these arrays.
    """
    check_params(params, cfg)
    tgt, src_, single = _check_pair(cfg, tgt_in, src)
    logits, cache = _forward(params, cfg, tgt, src_)
    if single:
        logits = logits[0]
        for key in ("self_attn", "cross_attn", "enc_attn"):
            if key in cache:
                cache[key] = cache[key][:, 0]
        for key in ("memory", "hidden", "logits"):
            if key in cache:
                cache[key] = cache[key][0]
    return logits, cache


# ----------------------------------------------------------------------------------------------
# the backward pass, written by hand: the forward's steps in reverse
# ----------------------------------------------------------------------------------------------
def _encoder_layer_backward(dh2: np.ndarray, c: dict, p: dict):
    """Gradient of an encoder layer's input, and of its parameters."""
    g = {}
    # 2. feed-forward, residual, norm:  h2 = LN2(h1 + FFN(h1)); attention-only: h2 = h1
    dh1, g_ffn = dh2, {}
    if "ffn" in c:
        d_sum, g["ln2_g"], g["ln2_b"] = L.layer_norm_backward(dh2, c["ln2"])
        dh1, g_ffn = L.feed_forward_backward(d_sum, c["ffn"], p)
        dh1 = dh1 + d_sum                                                  # the residual path
    # 1. self-attention, residual, norm:  h1 = LN1(h + MHA(h))
    d_sum, g["ln1_g"], g["ln1_b"] = L.layer_norm_backward(dh1, c["ln1"])
    dq, dkv, g_attn = L.attention_backward(d_sum, c["attn"], p)
    g.update(g_ffn)
    g.update(g_attn)
    return d_sum + dq + dkv, g                                             # queries, keys, values all read h


def _decoder_layer_backward(dx3: np.ndarray, c: dict, p: dict, pc):
    """Gradient of a decoder layer's input, of the memory (None without cross-attention), and of
    its parameters (cross-attention ones under their ``cross_`` names)."""
    g = {}
    # 3. feed-forward, residual, norm:  x3 = LN2(x2 + FFN(x2)); attention-only: x3 = x2
    dx2 = dx3
    if "ffn" in c:
        d_sum, g["ln2_g"], g["ln2_b"] = L.layer_norm_backward(dx3, c["ln2"])
        dx2, g_ffn = L.feed_forward_backward(d_sum, c["ffn"], p)
        dx2 = dx2 + d_sum
        g.update(g_ffn)
    # 2. cross-attention, residual, norm:  x2 = LN_cross(x1 + MHA(x1, memory))
    d_memory = None
    if "cross" in c:
        d_sum, g["ln_cross_g"], g["ln_cross_b"] = L.layer_norm_backward(dx2, c["ln_cross"])
        dq, d_memory, g_cross = L.attention_backward(d_sum, c["cross"], pc)
        dx1 = d_sum + dq
        g.update({f"cross_{name}": value for name, value in g_cross.items()})
    else:
        dx1 = dx2
    # 1. masked self-attention, residual, norm:  x1 = LN1(x + MHA(x))
    d_sum, g["ln1_g"], g["ln1_b"] = L.layer_norm_backward(dx1, c["ln1"])
    dq, dkv, g_self = L.attention_backward(d_sum, c["self"], p)
    g.update(g_self)
    return d_sum + dq + dkv, d_memory, g


def _embed_backward(dx: np.ndarray, tokens: np.ndarray, prefix: str, cfg: DecoderConfig, grads: dict, params):
    """Scatter the gradient of ``embed[tokens] + pos`` into the embedding (and learned position) rows."""
    d_embed = np.zeros_like(params[f"{prefix}embed"])
    np.add.at(d_embed, tokens.reshape(-1), dx.reshape(-1, cfg.d_model))  # a token seen twice adds twice
    grads[f"{prefix}embed"] = d_embed
    if cfg.positional == "learned":
        d_pos = np.zeros_like(params[f"{prefix}pos"])
        d_pos[:tokens.shape[1]] = dx.sum(axis=0)
        grads[f"{prefix}pos"] = d_pos


def _backward(params: dict, cfg: DecoderConfig, cache: dict, d_logits: np.ndarray) -> dict:
    grads: dict[str, np.ndarray] = {}
    # 4. output projection: logits = x W_out + b_out
    dx, grads["W_out"], grads["b_out"] = L.linear_backward(d_logits, cache["hidden"], params["W_out"])
    # 3. decoder layers, last first; each cross-attention adds to the memory's gradient
    d_memory = np.zeros_like(cache["memory"]) if cfg.cross_attention else None
    for i in reversed(range(cfg.n_layers)):
        prefix = f"dec.layers.{i}."
        pc = _sub(params, prefix, CROSS_PARAMS) if cfg.cross_attention else None
        dx, dm, g = _decoder_layer_backward(dx, cache["dec_layers"][i], _sub(params, prefix, LAYER_PARAMS), pc)
        grads.update({prefix + name: value for name, value in g.items()})
        if dm is not None:
            d_memory += dm
    # 2. decoder embeddings
    _embed_backward(dx, cache["tgt_in"], "dec.", cfg, grads, params)
    # 1. encoder layers, last first, from the memory's gradient; then its embeddings
    if cfg.cross_attention:
        dh = d_memory
        for i in reversed(range(cfg.n_layers)):
            prefix = f"enc.layers.{i}."
            dh, g = _encoder_layer_backward(dh, cache["enc_layers"][i], _sub(params, prefix, LAYER_PARAMS))
            grads.update({prefix + name: value for name, value in g.items()})
        _embed_backward(dh, cache["src"], "enc.", cfg, grads, params)
    return {name: grads[name] for name in param_shapes(cfg)}


def loss_and_grads(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None):
    r"""Mean cross-entropy of the next tokens and its gradient for every parameter.

    .. math:: \mathcal{L} = -\frac{1}{BT} \sum_{b,t} \log \mathrm{softmax}(\mathrm{logits}_{b,t})[y_{b,t}]

    Parameters
    ----------
    tgt_in : (B, T) or (T,) int, the decoder's input (the target shifted right)
    tgt_out : same shape, the tokens to predict
    src : (B, S) or (S,) int, encoder-decoder only

    Returns
    -------
    loss : float
    grads : dict, the same keys, shapes and dtype as ``params``
    """
    check_params(params, cfg)
    tgt, src_, _ = _check_pair(cfg, tgt_in, src)
    y = check_tokens(tgt_out, cfg.vocab_size, cfg.tgt_len, "The target output (tgt_out)")
    if y.shape != tgt.shape:
        raise ValueError(f"tgt_out has shape {np.shape(tgt_out)}, it must match tgt_in's {np.shape(tgt_in)}.")
    return _loss_and_grads(params, cfg, tgt, y, src_)


def _loss_and_grads(params, cfg, tgt_in, tgt_out, src):
    """:func:`loss_and_grads` on checked inputs (the training loop calls this)."""
    logits, cache = _forward(params, cfg, tgt_in, src)
    loss, d_logits = L.cross_entropy(logits, tgt_out)
    return float(loss), _backward(params, cfg, cache, d_logits)


# ----------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------
class KVCache:
    """Every decoder layer's keys and values of the positions read so far.

    ``K`` and ``V`` are allocated once for the whole context, ``(L, B, H, tgt_len, d_k)``; ``size``
    rows are filled. Each step appends the new positions' rows; earlier rows never change, since a
    position's keys and values depend only on the tokens up to it.
    """

    def __init__(self, cfg: DecoderConfig, batch: int, dtype):
        shape = (cfg.n_layers, batch, cfg.n_heads, cfg.tgt_len, cfg.d_k)
        self.K = np.zeros(shape, dtype=dtype)
        self.V = np.zeros(shape, dtype=dtype)
        self.size = 0

    def append(self, layer: int, K_new: np.ndarray, V_new: np.ndarray):
        """Write ``K_new, V_new (B, H, n, d_k)`` after the filled rows; return the layer's filled
        keys and values ``(B, H, size + n, d_k)`` (``size`` grows in :meth:`advance`)."""
        end = self.size + K_new.shape[2]
        self.K[layer, :, :, self.size:end] = K_new
        self.V[layer, :, :, self.size:end] = V_new
        return self.K[layer, :, :, :end], self.V[layer, :, :, :end]

    def advance(self, n: int):
        self.size += n


def _extend(params: dict, cfg: DecoderConfig, new_tokens: np.ndarray, kv: KVCache, cross_kv):
    """Run ``new_tokens (B, n)``, the positions after the cached ones, through the decoder.

    Each layer appends the new positions' keys and values to the cache, and their queries attend
    over every cached row (causally among the new ones). ``cross_kv`` holds each layer's encoder
    keys and values, projected once per generation. Returns ``logits (B, n, V)`` and each layer's
    self- and cross-attention weights ``(B, H, n, size + n)``, ``(B, H, n, S)``.
    """
    start, n = kv.size, new_tokens.shape[1]
    x = _embed(params, "dec.", new_tokens, cfg, start=start)                 # (B, n, d)
    mask = _causal_mask(n, start, x.dtype)                                   # (n, start + n)
    self_w, cross_w = [], []
    for i in range(cfg.n_layers):
        prefix = f"dec.layers.{i}."
        p = _sub(params, prefix, LAYER_PARAMS)
        # 1. masked self-attention over the cache and the new positions
        K, V = kv.append(i, *L.project_kv(x, p, cfg.n_heads))               # (B, H, start + n, d_k)
        a, c = L.attend(x, K, V, p, cfg.n_heads, mask)
        self_w.append(c["weights"])
        x = L.layer_norm(x + a, p["ln1_g"], p["ln1_b"], cfg.ln_eps)[0]
        # 2. cross-attention over the encoder's keys and values
        if cross_kv is not None:
            pc = _sub(params, prefix, CROSS_PARAMS)
            a, c = L.attend(x, *cross_kv[i], pc, cfg.n_heads)
            cross_w.append(c["weights"])
            x = L.layer_norm(x + a, pc["ln_cross_g"], pc["ln_cross_b"], cfg.ln_eps)[0]
        # 3. feed-forward (none in an attention-only model)
        if cfg.d_ff:
            x = L.layer_norm(x + L.feed_forward(x, p)[0], p["ln2_g"], p["ln2_b"], cfg.ln_eps)[0]
    kv.advance(n)
    return L.linear(x, params["W_out"], params["b_out"]), self_w, cross_w


@dataclasses.dataclass
class Generation:
    """What :func:`generate` produced, step by step (``n`` steps, one new token each).

    Shapes are for one sequence. For a batch, ``B`` leads every array (in ``self_attn``, each
    step's array) except ``cache_sizes`` and ``positions_computed``, which all sequences share.

    Attributes
    ----------
    tokens : (P + n,) the prompt, then the new tokens
    prompt_len : P
    step_logits : (n, V) the logits each new token was drawn from
    step_probs : (n, V) the sampler's distribution after temperature, top-k and top-p (zero outside
        ``allowed``)
    allowed : (n, V) bool, the tokens the sampler was allowed to pick
    cache_sizes : (n,) rows in the KV cache after the step's forward pass (the positions its keys
        and values cover); 0 without the cache
    positions_computed : (n,) positions run through the decoder at each step: the prompt and then
        one per step with the cache, the whole prefix every step without it
    self_attn : n arrays (L, H, P + s): step s's new query's causal self-attention row, per layer and head
    cross_attn : (n, L, H, S) the new query's cross-attention row (encoder-decoder only, else None)
    keys, values : (L, H, P + n - 1, d_k) the KV cache at the end (None without the cache); at step
        s it held the first ``cache_sizes[s]`` rows
    """

    tokens: np.ndarray
    prompt_len: int
    step_logits: np.ndarray
    step_probs: np.ndarray
    allowed: np.ndarray
    cache_sizes: np.ndarray
    positions_computed: np.ndarray
    self_attn: list
    cross_attn: np.ndarray | None
    keys: np.ndarray | None
    values: np.ndarray | None

    @property
    def new_tokens(self) -> np.ndarray:
        return self.tokens[..., self.prompt_len:]


def _check_generation_inputs(cfg, src, prompt, max_new_tokens):
    """Checked ``(src (B, S) or None, prompt (B, P))``, and whether one sequence was given."""
    if not _whole(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}.")
    single = True
    if cfg.cross_attention:
        if src is None:
            raise ValueError("This encoder-decoder needs a source sequence (src) to generate from.")
        single = np.ndim(src) == 1
        src = check_tokens(src, cfg.src_vocab_size, cfg.src_len, "The source")
    elif src is not None:
        raise ValueError("This is a decoder-only model (cross_attention=False): it takes no source; "
                         "give a prompt instead.")
    if prompt is None:
        if cfg.bos_id is None:
            raise ValueError("Give a prompt of at least one token: this model has no start token "
                             "(bos_id) to begin from.")
        prompt = [cfg.bos_id]
    if np.ndim(prompt) == 2:
        single = False
    prompt = check_tokens(prompt, cfg.vocab_size, cfg.tgt_len, "The prompt")        # refuses an empty one
    B = src.shape[0] if src is not None else prompt.shape[0]
    if prompt.shape[0] == 1 and B > 1:
        prompt = np.repeat(prompt, B, axis=0)                                # one prompt for every source
    if prompt.shape[0] != B:
        raise ValueError(f"The prompt has {prompt.shape[0]} rows and the source {B}.")
    P = prompt.shape[1]
    if P + max_new_tokens - 1 > cfg.tgt_len:
        raise ValueError(f"A prompt of {P} tokens plus {max_new_tokens} new ones needs a context of "
                         f"{P + max_new_tokens - 1} positions; this model reads at most {cfg.tgt_len}. "
                         f"Ask for at most {cfg.tgt_len - P + 1} new tokens.")
    return src, prompt, single


def generate(params: dict, cfg: DecoderConfig, src=None, *, prompt=None, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             use_cache: bool = True, seed: int = 0) -> Generation:
    """Generate ``max_new_tokens`` tokens one at a time, each drawn from the model's next-token
    distribution and appended to the input of the next step.

    Parameters
    ----------
    src : (S,) or (B, S) int, encoder-decoder only
        The source. Its encoder output is computed once and serves every step.
    prompt : (P,) or (B, P) int, optional
        The tokens to continue; a single prompt serves every source of a batch. Default:
        ``[cfg.bos_id]``; a model without ``bos_id`` (the character language model) needs a prompt of
        at least one token. ``P + max_new_tokens - 1 <= cfg.tgt_len``: the last new token is never
        read, so it needs no position.
    max_new_tokens : int >= 1
    temperature, top_k, top_p : the sampler (see :mod:`core.models.sampling`); ``temperature=0`` is
        greedy decoding
    use_cache : bool
        True: the prompt runs once, then each step runs only the new token, attending over the KV
        cache. False: each step recomputes the full causal forward pass over the whole prefix.
        Both give the same logits (to rounding) and, for a seed, the same tokens.
    seed : int
        Seeds this call's own ``numpy.random.Generator`` (the global state is never used).

    Returns
    -------
    Generation
    """
    check_params(params, cfg)
    settings = sampling.SamplerSettings(temperature, top_k, top_p)
    src, prompt, single = _check_generation_inputs(cfg, src, prompt, max_new_tokens)
    rng = np.random.default_rng(seed)
    B, P = prompt.shape
    n, Lr, H = int(max_new_tokens), cfg.n_layers, cfg.n_heads
    dtype = params["W_out"].dtype

    # the encoder runs once; with the cache, so do the cross-attention keys and values
    memory = _encode(params, cfg, src)[0] if cfg.cross_attention else None
    kv, cross_kv = None, None
    if use_cache:
        kv = KVCache(cfg, B, dtype)
        if memory is not None:
            cross_kv = [L.project_kv(memory, _sub(params, f"dec.layers.{i}.", CROSS_PARAMS), H)
                        for i in range(Lr)]

    tokens = np.concatenate([prompt, np.zeros((B, n), dtype=np.int64)], axis=1)
    V = cfg.vocab_size
    step_logits = np.zeros((B, n, V), dtype=dtype)
    step_probs = np.zeros((B, n, V))
    allowed = np.zeros((B, n, V), dtype=bool)
    cache_sizes = np.zeros(n, dtype=np.int64)
    computed = np.zeros(n, dtype=np.int64)
    self_rows = []
    cross_rows = np.zeros((B, n, Lr, H, src.shape[1]), dtype=dtype) if memory is not None else None
    for s in range(n):
        t = P + s                                                   # positions read at this step
        # 1. the logits of the next token, from the last position
        if use_cache:
            new = tokens[:, kv.size:t]                              # the prompt at first, then one token
            logits, self_w, cross_w = _extend(params, cfg, new, kv, cross_kv)
            computed[s], cache_sizes[s] = new.shape[1], kv.size
            self_rows.append(np.stack([w[:, :, -1] for w in self_w], axis=1))          # (B, L, H, t)
            if cross_rows is not None:
                cross_rows[:, s] = np.stack([w[:, :, -1] for w in cross_w], axis=1)    # (B, L, H, S)
        else:
            logits, _, caches = _decode(params, cfg, tokens[:, :t], memory)
            computed[s] = t
            self_rows.append(np.stack([c["self"]["weights"][:, :, -1] for c in caches], axis=1))
            if cross_rows is not None:
                cross_rows[:, s] = np.stack([c["cross"]["weights"][:, :, -1] for c in caches], axis=1)
        step_logits[:, s] = logits[:, -1]
        # 2. the sampler picks each sequence's next token
        for b in range(B):
            tokens[b, t], step_probs[b, s], allowed[b, s] = sampling.sample(step_logits[b, s], settings, rng)

    keys = values = None
    if use_cache:
        keys = kv.K[:, :, :, :kv.size].transpose(1, 0, 2, 3, 4).copy()  # (B, L, H, P + n - 1, d_k)
        values = kv.V[:, :, :, :kv.size].transpose(1, 0, 2, 3, 4).copy()
    out = Generation(tokens, P, step_logits, step_probs, allowed, cache_sizes, computed,
                     self_rows, cross_rows, keys, values)
    if single:
        for field in ("tokens", "step_logits", "step_probs", "allowed", "cross_attn", "keys", "values"):
            value = getattr(out, field)
            if value is not None:
                setattr(out, field, value[0])
        out.self_attn = [row[0] for row in out.self_attn]
    return out


def greedy_exact_match(params: dict, cfg: DecoderConfig, src, tgt_out, *, batch_size: int = 500) -> float:
    """Share of sequences whose greedy generation (from ``bos_id``) equals ``tgt_out`` at every position."""
    src, tgt_out = np.asarray(src), np.asarray(tgt_out)
    hits = 0
    for lo in range(0, len(src), batch_size):
        gen = generate(params, cfg, src[lo:lo + batch_size], max_new_tokens=tgt_out.shape[1], temperature=0)
        hits += int((gen.new_tokens == tgt_out[lo:lo + batch_size]).all(axis=1).sum())
    return hits / len(src)


def mean_loss(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None, *, batch_size: int = 500) -> float:
    """Mean cross-entropy over every position of a whole split (no gradients)."""
    check_params(params, cfg)
    total, count = 0.0, 0
    for lo in range(0, len(tgt_in), batch_size):
        chunk = slice(lo, lo + batch_size)
        tgt, src_, _ = _check_pair(cfg, tgt_in[chunk], None if src is None else src[chunk])
        logits = _forward(params, cfg, tgt, src_)[0]
        y = np.asarray(tgt_out[chunk])
        logp = L.log_softmax(logits.astype(np.float64))
        total += -np.take_along_axis(logp, y[..., None], axis=-1).sum()
        count += y.size
    return total / count


# ----------------------------------------------------------------------------------------------
# training: Adam on one flat buffer
# ----------------------------------------------------------------------------------------------
def pack(params: dict) -> tuple[np.ndarray, dict]:
    """Copy parameters into one flat buffer; return it and a dict of views into it (same names),
    so that one update of the buffer updates every parameter."""
    dtype = next(iter(params.values())).dtype
    flat = np.empty(sum(v.size for v in params.values()), dtype=dtype)
    views, at = {}, 0
    for name, value in params.items():
        views[name] = flat[at:at + value.size].reshape(value.shape)
        views[name][...] = value
        at += value.size
    return flat, views


class Adam:
    """Adam (Kingma & Ba) with bias correction on a flat buffer:
    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``, ``p -= lr m_hat / (sqrt(v_hat) + eps)``."""

    def __init__(self, size: int, dtype=np.float32, lr: float = 3e-3, betas=(0.9, 0.98), eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(betas[0]), float(betas[1]), float(eps)
        self.m = np.zeros(size, dtype=dtype)
        self.v = np.zeros(size, dtype=dtype)
        self.t = 0

    def step(self, flat: np.ndarray, grad: np.ndarray, lr: float | None = None) -> None:
        """Update ``flat`` in place (``lr`` overrides the base rate for this step, for a schedule)."""
        self.t += 1
        self.m *= self.beta1
        self.m += (1.0 - self.beta1) * grad
        self.v *= self.beta2
        self.v += (1.0 - self.beta2) * grad * grad
        rate = (self.lr if lr is None else lr) * math.sqrt(1.0 - self.beta2 ** self.t) / (1.0 - self.beta1 ** self.t)
        flat -= rate * self.m / (np.sqrt(self.v) + self.eps)


def train(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None, *, steps: int, batch_size: int = 64,
          lr: float = 3e-3, warmup: int = 50, seed: int = 0, callback=None, every: int = 0,
          on_params=None) -> list[float]:
    """Train ``params`` in place with Adam on random minibatches; return each step's loss.

    The learning rate rises linearly over ``warmup`` steps, then decays as a half cosine to a tenth
    of ``lr`` at the last step. ``callback(step, loss)``, if given, runs after every step; it may
    return True to stop early. ``on_params(step, params)``, if given, runs after every ``every``-th
    step but the last, with the parameters as they are then (views into the training buffer: read
    them, do not keep them). Each step's loss and gradient are :func:`loss_and_grads`'s, computed
    in one compiled call (``core.models.decoder_step``; the tests hold the two together).
    """
    check_params(params, cfg)
    tgt_all, src_all, _ = _check_pair(cfg, tgt_in, src)
    y_all = check_tokens(tgt_out, cfg.vocab_size, cfg.tgt_len, "The target output (tgt_out)")
    if y_all.shape != tgt_all.shape:
        raise ValueError("tgt_out must have the same shape as tgt_in.")
    if not _whole(steps) or steps < 1 or not _whole(batch_size) or batch_size < 1:
        raise ValueError("steps and batch_size must be positive whole numbers.")
    names = list(param_shapes(cfg))
    flat, views = pack({name: params[name] for name in names})      # flat follows the names' order
    gradient = decoder_step.Gradient(cfg, flat)     # _loss_and_grads's numbers, in one compiled call
    grads = np.empty_like(flat)
    opt = Adam(flat.size, flat.dtype, lr)
    rng = np.random.default_rng(seed)
    losses = []
    for step in range(steps):
        idx = rng.integers(0, len(tgt_all), size=batch_size)
        loss = gradient(tgt_all[idx], y_all[idx], None if src_all is None else src_all[idx], grads)
        progress = step / max(steps - 1, 1)
        rate = lr * min(1.0, (step + 1) / max(warmup, 1)) * (0.55 + 0.45 * math.cos(math.pi * progress))
        opt.step(flat, grads, rate)
        losses.append(loss)
        if callback is not None and callback(step, loss):
            break
        if on_params is not None and every > 0 and (step + 1) % every == 0 and step + 1 < steps:
            on_params(step + 1, views)
    for name in names:
        params[name][...] = views[name]
    return losses
