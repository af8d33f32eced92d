"""The decoder's forward pass (teacher forcing, a causal mask; cross-attention over the encoder's
output in an encoder-decoder), its loss and gradient, and the checks of its inputs. The forward and
backward passes are the one transformer's (:mod:`core.model.transformer`,
:mod:`core.model.transformer_encdec`), run under the decoder's settings and names
(:mod:`core.model.vocabulary`). The architecture is described in ``core.model.decoder``."""
from __future__ import annotations

import numpy as np

from core.model import params as P
from core.model import transformer, transformer_encdec, vocabulary
from core.model.decoder_config import DecoderConfig, param_shapes


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


def attention_weights(cache: dict, cfg: DecoderConfig, sublayer: str = "attn", query: int | None = None) -> np.ndarray:
    """Every decoder block's attention weights from a forward cache, stacked: ``(L, B, H, T, Tk)``,
    or with ``query`` (an index) only that query's row of each, ``(L, B, H, Tk)``: generation reads
    the last row at every step and need not copy the others. ``sublayer`` is ``"attn"`` (the masked
    self-attention) or ``"cross"`` (an encoder-decoder's cross-attention, ``Tk = S``)."""
    stack = "dec." if cfg.cross_attention else ""
    weights = [cache[f"{stack}blocks.{i}.{sublayer}.weights"] for i in range(cfg.n_layers)]
    return np.stack(weights if query is None else [w[:, :, query] for w in weights])


def forward(params: dict, cfg: DecoderConfig, tgt_in, src=None):
    """Teacher-forced forward pass with a causal mask: the one transformer's, with the decoder's
    settings (:func:`core.model.vocabulary.decoder_settings`).

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
    logits : (B, T, V), or (T, V) for one sequence
        ``logits[b, t]`` scores the token after ``tgt_in[b, :t+1]``; it depends on no later position.
    cache : dict in the one vocabulary, always with the batch axis
        A decoder-only model: :func:`core.model.transformer.forward`'s (``blocks.{i}.attn.weights``
        (B, H, T, T), zero above the diagonal, ...). An encoder-decoder:
        :func:`core.model.transformer_encdec.forward`'s, the two stacks under ``enc.`` and ``dec.``
        (``dec.blocks.{i}.cross.weights`` (B, H, T, S), ``memory`` (B, S, d), ...).
        :func:`attention_weights` stacks a sublayer's weights over the blocks.
    """
    check_params(params, cfg)                     # once: the stacks' forward_checked skip their own check
    tgt, src_, single = _check_pair(cfg, tgt_in, src)
    tparams, tcfg = vocabulary.from_decoder(params, cfg)
    if cfg.cross_attention:
        logits, cache = transformer_encdec.forward_checked(tparams, tcfg, src_, tgt)
    else:
        logits, cache = transformer.forward_checked(tparams, tcfg, tgt)
    return (logits[0] if single else logits), cache


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
    # the one transformer's forward and hand-written backward (core.model.transformer_backward)
    return vocabulary.decoder_loss_and_grads(params, cfg, tgt, y, src_)
