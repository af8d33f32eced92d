"""The one name table between the older models' parameter names and the one transformer's.

The seeds' encoder classifier (:mod:`core.model.encoder`) and the decoder-only language model
(:mod:`core.model.decoder`: decoder-only, attention-only with ``d_ff=0``, and encoder-decoder)
are settings of :mod:`core.model.transformer`. Their parameters keep their older names in their
own modules, weight files and compiled steps; this module renames them, one table for all::

    encoder                 decoder-only              transformer
    embed, pos              dec.embed, dec.pos        embed, pos
    layers.{i}.W_Q ... b_O  dec.layers.{i}.W_Q ...    blocks.{i}.attn.W_Q ... blocks.{i}.attn.b_O
    layers.{i}.ln1_g, _b    dec.layers.{i}.ln1_g ...  blocks.{i}.ln1.g, blocks.{i}.ln1.b
    layers.{i}.W_1 ... b_2  dec.layers.{i}.W_1 ...    blocks.{i}.ffn.W_1 ... blocks.{i}.ffn.b_2
    layers.{i}.ln2_g, _b    dec.layers.{i}.ln2_g ...  blocks.{i}.ln2.g, blocks.{i}.ln2.b
    W_cls, b_cls                                      classifier.W, classifier.b
                            W_out, b_out              unembed, unembed_b

Both are post-norm, ReLU, with biases and no final LayerNorm; the encoder attends both ways and
classifies the mean over positions, the decoder is causal with an untied, biased unembedding.
An encoder-decoder (:mod:`core.model.transformer_encdec`) keeps its stacks' prefixes:
``enc.layers.{i}.W_Q`` -> ``enc.blocks.{i}.attn.W_Q``, ``dec.layers.{i}.cross_W_Q`` ->
``dec.blocks.{i}.cross.W_Q``, ``dec.layers.{i}.ln_cross_g`` -> ``dec.blocks.{i}.ln_cross.g``,
``W_out``, ``b_out`` -> ``unembed``, ``unembed_b``. Arrays are shared, not copied.

:func:`encoder_loss_and_grads` and :func:`decoder_loss_and_grads` are the readable twins of the
compiled steps, with their signatures and names: the one transformer's backward pass underneath.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import decoder_config, encoder_config
from core.model.decoder_config import DecoderConfig
from core.model.encoder_config import EncoderConfig
from core.model import transformer_backward, transformer_encdec
from core.model.params import check_params
from core.model.config import TransformerConfig, param_shapes
from core.model.transformer_encdec import EncoderDecoderConfig

# one layer's arrays: the older short name -> the block's short name
LAYER_NAMES = {**{f"{w}_{n}": f"attn.{w}_{n}" for w in "Wb" for n in "QKVO"},
               "ln1_g": "ln1.g", "ln1_b": "ln1.b", "ln2_g": "ln2.g", "ln2_b": "ln2.b",
               "W_1": "ffn.W_1", "b_1": "ffn.b_1", "W_2": "ffn.W_2", "b_2": "ffn.b_2",
               **{f"cross_{w}_{n}": f"cross.{w}_{n}" for w in "Wb" for n in "QKVO"},
               "ln_cross_g": "ln_cross.g", "ln_cross_b": "ln_cross.b"}
ENCODER_TOP = {"embed": "embed", "pos": "pos", "W_cls": "classifier.W", "b_cls": "classifier.b"}
DECODER_TOP = {"dec.embed": "embed", "dec.pos": "pos", "W_out": "unembed", "b_out": "unembed_b"}
ENCODER_DECODER_TOP = {**{f"{s}.{n}": f"{s}.{n}" for s in ("enc", "dec") for n in ("embed", "pos")},
                       "W_out": "unembed", "b_out": "unembed_b"}


# ----------------------------------------------------------------------------------------------
# the settings
# ----------------------------------------------------------------------------------------------
def encoder_settings(cfg: EncoderConfig) -> TransformerConfig:
    """The seeds' encoder classifier as settings: post-norm, ReLU, no causal mask, a classifier head."""
    return TransformerConfig(vocab_size=cfg.vocab_size, n_ctx=cfg.seq_len, d_model=cfg.d_model,
                             n_heads=cfg.n_heads, d_ff=cfg.d_ff, n_layers=cfg.n_layers, norm="post",
                             activation="relu", positional=cfg.positional, causal=False, ln_eps=cfg.ln_eps,
                             head="classify", n_classes=cfg.n_classes)


def decoder_settings(cfg: DecoderConfig):
    """A decoder-only language model as settings: post-norm, ReLU, causal, an untied unembedding with
    its bias (``d_ff=0``: attention-only); an encoder-decoder as an
    :class:`~core.model.transformer_encdec.EncoderDecoderConfig` of two such stacks."""
    if cfg.cross_attention:
        return EncoderDecoderConfig(
            TransformerConfig(vocab_size=cfg.src_vocab_size, n_ctx=cfg.src_len, d_model=cfg.d_model,
                              n_heads=cfg.n_heads, d_ff=cfg.d_ff, n_layers=cfg.n_layers,
                              positional=cfg.positional, causal=False, ln_eps=cfg.ln_eps),
            decoder_settings(dataclasses.replace(cfg, cross_attention=False, src_vocab_size=None, src_len=None)))
    return TransformerConfig(vocab_size=cfg.vocab_size, n_ctx=cfg.tgt_len, d_model=cfg.d_model,
                             n_heads=cfg.n_heads, d_ff=cfg.d_ff, n_layers=cfg.n_layers, norm="post",
                             activation="relu", positional=cfg.positional, causal=True, ln_eps=cfg.ln_eps,
                             unembed_b=True)


# ----------------------------------------------------------------------------------------------
# the names
# ----------------------------------------------------------------------------------------------
def _table(old_names, top: dict, layers_prefix: str) -> dict[str, str]:
    """``{older name: transformer name}`` for every name in ``old_names``; an encoder-decoder's
    layers (``layers_prefix`` None) keep their stack's prefix (``enc.``, ``dec.``)."""
    table = {}
    for old in old_names:
        if old in top:
            table[old] = top[old]
            continue
        stack, rest = (old[:4], old[4:]) if layers_prefix is None else ("", old.removeprefix(layers_prefix))
        i, short = rest.removeprefix("layers.").split(".", 1)             # "3", "ln1_g"
        table[old] = f"{stack}blocks.{i}.{LAYER_NAMES[short]}"
    return table


def encoder_names(cfg: EncoderConfig) -> dict[str, str]:
    """``{encoder name: transformer name}``, in the encoder's parameter order."""
    return _table(encoder_config.param_shapes(cfg), ENCODER_TOP, "layers.")


def decoder_names(cfg: DecoderConfig) -> dict[str, str]:
    """``{decoder name: transformer name}``, in the decoder's parameter order."""
    if cfg.cross_attention:
        return _table(decoder_config.param_shapes(cfg), ENCODER_DECODER_TOP, None)
    return _table(decoder_config.param_shapes(cfg), DECODER_TOP, "dec.layers.")


def _renamed(arrays: dict, table: dict, what: str) -> dict:
    missing = [name for name in table if name not in arrays]
    if missing or len(arrays) != len(table):
        extra = sorted(set(arrays) - set(table))
        raise ValueError(f"These are not the {what}: missing {missing[:3]}, unexpected {extra[:3]}.")
    return {new: arrays[old] for old, new in table.items()}


def from_encoder(params: dict, cfg: EncoderConfig) -> tuple[dict, TransformerConfig]:
    """The encoder's parameters under the transformer's names, and its settings."""
    tcfg = encoder_settings(cfg)
    tparams = _renamed(params, encoder_names(cfg), "encoder's parameters")
    return {name: tparams[name] for name in param_shapes(tcfg)}, tcfg


def to_encoder_names(arrays: dict, cfg: EncoderConfig) -> dict:
    """Parameters or gradients under the transformer's names, back under the encoder's (its order)."""
    back = {new: old for old, new in encoder_names(cfg).items()}
    return _renamed(arrays, back, "encoder's arrays under the transformer's names")


def from_decoder(params: dict, cfg: DecoderConfig) -> tuple[dict, TransformerConfig]:
    """A decoder's parameters under the transformer's names, and its settings."""
    tcfg = decoder_settings(cfg)
    tparams = _renamed(params, decoder_names(cfg), "decoder's parameters")
    shapes = transformer_encdec.param_shapes(tcfg) if cfg.cross_attention else param_shapes(tcfg)
    return {name: tparams[name] for name in shapes}, tcfg


def to_decoder_names(arrays: dict, cfg: DecoderConfig) -> dict:
    """Parameters or gradients under the transformer's names, back under the decoder's (its order)."""
    back = {new: old for old, new in decoder_names(cfg).items()}
    return _renamed(arrays, back, "decoder's arrays under the transformer's names")


def unflatten(flat: np.ndarray, shapes: dict) -> dict:
    """A flat buffer packed in ``shapes`` order (a compiled step's gradient) as named views."""
    out, at = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = flat[at:at + size].reshape(shape)
        at += size
    return out


# ----------------------------------------------------------------------------------------------
# the readable step under the older names: drop-in twins of the compiled steps
# ----------------------------------------------------------------------------------------------
def encoder_loss_and_grads(params: dict, tokens, labels, cfg: EncoderConfig):
    """:func:`core.model.encoder.loss_and_grads` (compiled) computed by the one transformer's
    readable backward pass (:func:`core.model.transformer_backward.loss_and_grads`): the mean
    cross-entropy over the batch's sequences and its gradient, under the encoder's names."""
    encoder_config.check_params(params, cfg)
    tparams, tcfg = from_encoder(params, cfg)
    loss, grads = transformer_backward.loss_and_grads(tparams, tcfg, encoder_config.check_tokens(tokens, cfg), labels)
    return loss, to_encoder_names(grads, cfg)


def decoder_loss_and_grads(params: dict, cfg: DecoderConfig, tgt_in, tgt_out, src=None):
    """:func:`core.model.decoder.loss_and_grads` (and the compiled ``decoder_step.Gradient``) computed
    by the one transformer's readable backward pass: the mean cross-entropy over every target token
    and its gradient, under the decoder's names."""
    check_params(params, decoder_config.param_shapes(cfg))
    tparams, tcfg = from_decoder(params, cfg)
    if cfg.cross_attention:
        if src is None:
            raise ValueError("This encoder-decoder needs a source sequence (src).")
        loss, grads = transformer_encdec.loss_and_grads(tparams, tcfg, src, tgt_in, tgt_out)
    else:
        if src is not None:
            raise ValueError("This is a decoder-only model (cross_attention=False): it takes no source.")
        loss, grads = transformer_backward.loss_and_grads(tparams, tcfg, tgt_in, tgt_out)
    return loss, to_decoder_names(grads, cfg)

