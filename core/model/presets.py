"""The models this app trains and loads, as named settings of the one transformer.

Each preset is a function that returns a :class:`~core.model.config.TransformerConfig` (or, for
``seq2seq``, an :class:`~core.model.transformer_encdec.EncoderDecoderConfig` of two of them); the
sizes are its arguments, the architecture is fixed::

    preset               blocks                       attends    output
    encoder_classifier   post-norm, ReLU, biases      both ways  mean over positions -> classifier
    decoder_lm           post-norm, ReLU, biases      causally   untied unembedding with a bias
    attention_only       decoder_lm with d_ff=0: no feed-forward sublayers (the induction model)
    seq2seq              an encoder stack (no head) read by a decoder_lm through cross-attention
    gpt2                 pre-norm, tanh GELU, learned positions, a final LayerNorm, tied unembedding

The first four are the original Transformer's blocks, which the compiled training steps run
(:mod:`core.model.tuned.offsets`); GPT-2's are loaded from its published weights.
"""
from __future__ import annotations

from core.model.config import EMBEDDING_POSITIONAL, TransformerConfig
from core.model.transformer_encdec import EncoderDecoderConfig


def encoder_classifier(vocab_size: int = 10, n_ctx: int = 16, d_model: int = 32, n_heads: int = 4, d_ff: int = 64,
                       n_layers: int = 2, n_classes: int = 2, positional: str = "sinusoidal",
                       ln_eps: float = 1e-5) -> TransformerConfig:
    """The seeds' tiny encoder: attends both ways and classifies the mean of its last hidden states; its
    positions are added to the embeddings (:data:`~core.model.config.EMBEDDING_POSITIONAL`)."""
    if positional not in EMBEDDING_POSITIONAL:
        raise ValueError(f"positional must be one of {', '.join(EMBEDDING_POSITIONAL)} for this encoder, "
                         f"got {positional!r}.")
    return TransformerConfig(vocab_size=vocab_size, n_ctx=n_ctx, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                             n_layers=n_layers, norm_placement="post", activation="relu", positional=positional,
                             causal=False, ln_eps=ln_eps, head="classify", n_classes=n_classes)


def decoder_lm(vocab_size: int, n_ctx: int, d_model: int = 32, n_heads: int = 4, d_ff: int = 64, n_layers: int = 2,
               positional: str = "sinusoidal", ln_eps: float = 1e-5) -> TransformerConfig:
    """A causal language model with the original Transformer's blocks and a biased unembedding."""
    return TransformerConfig(vocab_size=vocab_size, n_ctx=n_ctx, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                             n_layers=n_layers, norm_placement="post", activation="relu", positional=positional,
                             causal=True, ln_eps=ln_eps, unembed_b=True)


def attention_only(vocab_size: int, n_ctx: int, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                   positional: str = "sinusoidal", ln_eps: float = 1e-5) -> TransformerConfig:
    """:func:`decoder_lm` without feed-forward sublayers: each block is ``x = LN1(x + MHA(x))``."""
    return decoder_lm(vocab_size, n_ctx, d_model, n_heads, 0, n_layers, positional, ln_eps)


def seq2seq(vocab_size: int, n_ctx: int, src_vocab_size: int, src_len: int, d_model: int = 32, n_heads: int = 4,
            d_ff: int = 64, n_layers: int = 2, positional: str = "sinusoidal", ln_eps: float = 1e-5,
            bos_id: int | None = None) -> EncoderDecoderConfig:
    """An encoder-decoder: a source stack of ``src_len`` positions over ``src_vocab_size`` ids, read by
    a :func:`decoder_lm` of ``n_ctx`` target positions; generation starts from ``bos_id``."""
    source = TransformerConfig(vocab_size=src_vocab_size, n_ctx=src_len, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                               n_layers=n_layers, positional=positional, causal=False, ln_eps=ln_eps, head="none")
    return EncoderDecoderConfig(source, decoder_lm(vocab_size, n_ctx, d_model, n_heads, d_ff, n_layers, positional,
                                                   ln_eps), bos_id)


def gpt2(vocab_size: int = 50257, n_ctx: int = 1024, d_model: int = 768, n_heads: int = 12, n_layers: int = 12,
         d_ff: int | None = None, activation: str = "gelu_tanh", ln_eps: float = 1e-5) -> TransformerConfig:
    """GPT-2's architecture (the small model's sizes by default; ``d_ff`` defaults to ``4 d_model``)."""
    return TransformerConfig(vocab_size=vocab_size, n_ctx=n_ctx, d_model=d_model, n_heads=n_heads,
                             d_ff=4 * d_model if d_ff is None else d_ff, n_layers=n_layers, norm_placement="pre",
                             activation=activation, positional="learned", tied_unembed=True, final_ln=True,
                             causal=True, ln_eps=ln_eps)
