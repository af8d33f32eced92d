"""The decoder's readable forward pass, sublayer by sublayer (teacher forcing, a causal mask;
cross-attention over the encoder's output in an encoder-decoder), the checks of its inputs, and
its loss and gradient, which the one transformer's hand-written backward pass computes
(:mod:`core.models.vocabulary`). The architecture is described in ``core.models.decoder``."""
from __future__ import annotations

import numpy as np

from core.models import layers as L
from core.models import params as P
from core.models import vocabulary
from core.models.decoder_config import CROSS_PARAMS, LAYER_PARAMS, DecoderConfig, param_shapes


def check_params(params: dict, cfg: DecoderConfig) -> np.dtype:
    """Refuse missing, misshaped, mixed-precision or non-finite parameters; return their dtype."""
    return P.check_params(params, param_shapes(cfg))


def check_tokens(tokens, vocab_size: int, max_len: int, what: str) -> np.ndarray:
    """Token ids ``(T,)`` or ``(B, T)`` -> int64 ``(B, T)``; ids in ``0..vocab_size-1``, ``1 <= T <= max_len``."""
    return P.check_tokens(tokens, vocab_size, max_len, what)


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


def _layer(x: np.ndarray, p: dict, cfg: DecoderConfig, mask=None, memory=None, pc=None):
    """One post-norm layer on ``x (B, T, d)``: ``(x_out, cache)``. An encoder layer has no ``mask``
    (it sees the whole source) and no ``memory``; a decoder layer has the causal mask, and in an
    encoder-decoder the encoder's output ``memory (B, S, d)`` with the cross-attention parameters ``pc``."""
    c = {}
    # 1. self-attention (masked in a decoder), residual, norm
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
        h, c = _layer(h, _sub(params, f"enc.layers.{i}.", LAYER_PARAMS), cfg)
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
        x, c = _layer(x, _sub(params, prefix, LAYER_PARAMS), cfg, mask, memory, pc)
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
        cache["enc_attn"] = np.stack([c["self"]["weights"] for c in cache["enc_layers"]])   # (L, B, H, S, S)
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
    # the one transformer's forward and hand-written backward (core.models.transformer_backward)
    return vocabulary.decoder_loss_and_grads(params, cfg, tgt, y, src_)
