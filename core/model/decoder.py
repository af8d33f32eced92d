"""The decoders: an encoder-decoder and a decoder-only language model (attention-only with
``d_ff=0``), run by the one transformer, with their input checks, evaluation and generation.

Architecture (the original Transformer: post-norm, ReLU, no dropout)::

    encoder (an encoder-decoder only), on the source ids src (B, S):
        m = enc.embed[src] + PE                                   # (B, S, d)
        per block:  m = LN1(m + MHA(m))
                    m = LN2(m + FFN(m))
    decoder, on the target ids tgt_in (B, T) (teacher forcing: the target shifted right):
        x = embed[tgt_in] + PE                                    # (B, T, d); dec.embed in an encoder-decoder
        per block:  x = LN1(x + MHA(x, causal mask))              # masked self-attention
                    x = LN_cross(x + MHA(x, over m))              # cross-attention (encoder-decoder only)
                    x = LN2(x + FFN(x))
        logits = x unembed + unembed_b                            # (B, T, V)
    loss = mean cross-entropy over every target position

Cross-attention takes its queries from the decoder and its keys and values from the encoder's
output ``m`` (the "memory"). A decoder-only block is an encoder block with a causal mask.

``cfg`` is a :class:`~core.model.config.TransformerConfig` (a decoder-only model:
:func:`core.model.presets.decoder_lm`, :func:`~core.model.presets.attention_only`) or an
:class:`~core.model.transformer_encdec.EncoderDecoderConfig` (:func:`core.model.presets.seq2seq`).
Parameters are a ``dict[str, np.ndarray]`` in the one vocabulary (``embed``, ``pos``,
``blocks.{i}.attn.W_Q``, ``blocks.{i}.ln1.g``, ``blocks.{i}.ffn.W_1``, ``unembed``, ``unembed_b``;
an encoder-decoder prefixes its stacks with ``enc.`` and ``dec.`` and adds
``dec.blocks.{i}.cross.W_Q ... b_O`` and ``dec.blocks.{i}.ln_cross.g|b``), computed in their own
dtype, float32 or float64. Generation is :func:`core.model.generation.generate`.
"""
from __future__ import annotations

import numpy as np

from core.model import config, presets, transformer, transformer_backward, transformer_encdec
from core.model import layers
from core.model import params as P
from core.model.generation import generate
from core.model.transformer_encdec import EncoderDecoderConfig, target_stack

ADAM_BETAS = (0.9, 0.98)          # the original Transformer's; the loop is core.training.decoder_runs.train


def DecoderConfig(vocab_size: int, tgt_len: int, d_model: int = 32, n_heads: int = 4, d_ff: int = 64,
                  n_layers: int = 2, cross_attention: bool = True, src_vocab_size: int | None = None,
                  src_len: int | None = None, positional: str = "sinusoidal", ln_eps: float = 1e-5,
                  bos_id: int | None = None):
    """The design's constructor: an encoder-decoder (``cross_attention=True``, which needs
    ``src_vocab_size`` and ``src_len``: :func:`core.model.presets.seq2seq`) or a decoder-only
    language model (``False``, no source and no ``bos_id``: :func:`core.model.presets.decoder_lm`;
    attention-only with ``d_ff=0``). ``tgt_len`` is the decoder's context, the preset's ``n_ctx``."""
    sizes = dict(d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_layers=n_layers, positional=positional,
                 ln_eps=ln_eps)
    if cross_attention:
        if src_vocab_size is None or src_len is None:
            raise ValueError("An encoder-decoder (cross_attention=True) needs src_vocab_size and src_len.")
        return presets.seq2seq(vocab_size, tgt_len, src_vocab_size, src_len, bos_id=bos_id, **sizes)
    if src_vocab_size is not None or src_len is not None or bos_id is not None:
        raise ValueError("A decoder-only model (cross_attention=False) has no source and no start token: "
                         "leave src_vocab_size, src_len and bos_id unset.")
    return presets.decoder_lm(vocab_size, tgt_len, **sizes)


# ----------------------------------------------------------------------------------------------
# the parameters and the inputs
# ----------------------------------------------------------------------------------------------
def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in the flat buffer's order."""
    if isinstance(cfg, EncoderDecoderConfig):
        return transformer_encdec.param_shapes(cfg)
    return config.param_shapes(cfg)


def param_count(cfg) -> int:
    """Number of trainable numbers in the model."""
    return P.count(param_shapes(cfg))


def init_params(cfg, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters, deterministic for a seed: weights ``N(0, 1/d_in)``, embeddings
    ``N(0, 1)``, learned positions ``N(0, 0.1^2)``, biases 0, layer-norm gains 1."""
    if isinstance(cfg, EncoderDecoderConfig):
        return transformer_encdec.init_params(cfg, seed, dtype)
    return config.init_params(cfg, seed, dtype)


def check_pair(cfg, tgt, src):
    """Checked ``(tgt (B, T), src (B, S) or None, single)``: ``single`` when the caller passed one sequence."""
    single, target = np.ndim(tgt) == 1, target_stack(cfg)
    tgt = P.check_tokens(tgt, target.vocab_size, target.n_ctx, "The target")
    if not isinstance(cfg, EncoderDecoderConfig):
        if src is not None:
            raise ValueError("This is a decoder-only model: it takes no source.")
        return tgt, None, single
    if src is None:
        raise ValueError("This encoder-decoder needs a source sequence (src).")
    if (np.ndim(src) == 1) != single:
        raise ValueError("Give the source and the target both as one sequence or both as a batch.")
    src = P.check_tokens(src, cfg.encoder.vocab_size, cfg.encoder.n_ctx, "The source")
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"The source has {src.shape[0]} sequences and the target {tgt.shape[0]}.")
    return tgt, src, single


def check_targets(cfg, tgt_in, tgt_out) -> np.ndarray:
    """``tgt_out`` checked as int64 ``(B, T)``, the shape of the checked ``tgt_in``."""
    target = target_stack(cfg)
    y = P.check_tokens(tgt_out, target.vocab_size, target.n_ctx, "The target output (tgt_out)")
    if y.shape != tgt_in.shape:
        raise ValueError(f"tgt_out has shape {np.shape(tgt_out)}, it must match tgt_in's {tgt_in.shape}.")
    return y


# ----------------------------------------------------------------------------------------------
# the passes
# ----------------------------------------------------------------------------------------------
def forward(params: dict, cfg, tgt_in, src=None):
    """Teacher-forced forward pass with a causal mask: the one transformer's.

    Parameters
    ----------
    params : dict from :func:`init_params`
    cfg : TransformerConfig (decoder-only) or EncoderDecoderConfig
    tgt_in : (B, T) or (T,) int
        The decoder's input: the target shifted right (``T <= n_ctx``).
    src : (B, S) or (S,) int, encoder-decoder only
        The source (``S <= cfg.encoder.n_ctx``).

    Returns
    -------
    logits : (B, T, V), or (T, V) for one sequence
        ``logits[b, t]`` scores the token after ``tgt_in[b, :t+1]``; it depends on no later position.
    cache : dict in the one vocabulary, always with the batch axis
        A decoder-only model: :func:`core.model.transformer.forward`'s (``blocks.{i}.attn.weights``
        (B, H, T, T), zero above the diagonal, ...). An encoder-decoder:
        :func:`core.model.transformer_encdec.forward`'s, the two stacks under ``enc.`` and ``dec.``
        (``dec.blocks.{i}.cross.weights`` (B, H, T, S), ``memory`` (B, S, d), ...).
        :func:`core.model.generation.attention_weights` stacks a sublayer's weights over the blocks.
    """
    config.check_params(params, param_shapes(cfg), finite=True)   # once: the stacks' forward_checked skip theirs
    tgt, src, single = check_pair(cfg, tgt_in, src)
    if isinstance(cfg, EncoderDecoderConfig):
        logits, cache = transformer_encdec.forward_checked(params, cfg, src, tgt)
    else:
        logits, cache = transformer.forward_checked(params, cfg, tgt)
    return (logits[0] if single else logits), cache


def loss_and_grads(params: dict, cfg, tgt_in, tgt_out, src=None):
    r"""Mean cross-entropy of the next tokens and its gradient for every parameter: the one
    transformer's forward and hand-written backward (:mod:`core.model.transformer_backward`,
    :mod:`core.model.transformer_encdec`), the readable twin of ``decoder_step.Gradient``.

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
    config.check_params(params, param_shapes(cfg), finite=True)
    tgt, src, _ = check_pair(cfg, tgt_in, src)
    y = check_targets(cfg, tgt, tgt_out)
    if isinstance(cfg, EncoderDecoderConfig):
        return transformer_encdec.loss_and_grads(params, cfg, src, tgt, y)
    return transformer_backward.loss_and_grads(params, cfg, tgt, y)


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------
def greedy_exact_match(params: dict, cfg: EncoderDecoderConfig, src, tgt_out, *, batch_size: int = 500) -> float:
    """Share of sequences whose greedy generation (from ``bos_id``) equals ``tgt_out`` at every position."""
    src, tgt_out = np.asarray(src), np.asarray(tgt_out)
    hits = 0
    for lo in range(0, len(src), batch_size):
        gen = generate(params, cfg, src[lo:lo + batch_size], max_new_tokens=tgt_out.shape[1], temperature=0)
        hits += int((gen.new_tokens == tgt_out[lo:lo + batch_size]).all(axis=1).sum())
    return hits / len(src)


def mean_loss(params: dict, cfg, tgt_in, tgt_out, src=None, *, batch_size: int = 500) -> float:
    """Mean cross-entropy over every position of a whole split (no gradients)."""
    config.check_params(params, param_shapes(cfg), finite=True)
    total, count = 0.0, 0
    for lo in range(0, len(tgt_in), batch_size):
        chunk = slice(lo, lo + batch_size)
        logits = forward(params, cfg, tgt_in[chunk], None if src is None else src[chunk])[0]
        y = np.asarray(tgt_out[chunk])
        logp = layers.log_softmax(logits.astype(np.float64))
        total += -np.take_along_axis(logp, y[..., None], axis=-1).sum()
        count += y.size
    return total / count
