"""The compiled steps' layout: every offset finds the array its slot names, and the kernels' views of
a block read the arrays of the one vocabulary."""
import math

import numpy as np
import pytest

from core.model import decoder, presets
from core.model import params as P
from core.model.config import TransformerConfig
from core.model.tuned import decoder_gradient, offsets, sublayers

ENCODER = presets.encoder_classifier(vocab_size=7, n_ctx=5, d_model=4, n_heads=2, d_ff=6, n_layers=2, n_classes=3,
                                     positional="learned")
DECODER = presets.decoder_lm(9, 6, d_model=4, n_heads=2, d_ff=6, n_layers=2)
ATTENTION_ONLY = presets.attention_only(9, 6, d_model=4, n_heads=2, n_layers=2, positional="learned")
SEQ2SEQ = presets.seq2seq(9, 6, 8, 5, d_model=4, n_heads=2, d_ff=6, n_layers=2, positional="learned")


def packed(cfg):
    params = decoder.init_params(cfg, 0, np.float64)
    flat, _ = P.pack(params)
    return params, flat


def read(flat, at, shape):
    return flat[at:at + math.prod(shape)].reshape(shape)


def stacks(cfg):
    """(layout, prefix, settings) of each stack that has blocks."""
    if isinstance(cfg, TransformerConfig) and cfg.head == "classify":
        return [(offsets.encoder_layout(cfg), "", cfg)]
    lay = offsets.decoder_layout(cfg)
    if isinstance(cfg, TransformerConfig):
        return [(lay.dec, "", cfg)]
    return [(lay.enc, "enc.", cfg.encoder), (lay.dec, "dec.", cfg.decoder)]


@pytest.mark.parametrize("cfg", [ENCODER, DECODER, ATTENTION_ONLY, SEQ2SEQ],
                         ids=["encoder", "decoder", "attention-only", "seq2seq"])
def test_every_slot_finds_the_array_of_its_name(cfg):
    params, flat = packed(cfg)
    for lay, prefix, stack in stacks(cfg):
        assert lay.layers.shape == (stack.n_layers, len(sublayers.LAYER_SLOTS))
        for i in range(stack.n_layers):
            for slot, at in zip(sublayers.LAYER_SLOTS, lay.layers[i]):
                name = f"{prefix}blocks.{i}.{slot}"
                if name in params:                     # an attention-only block has no ffn.* nor ln2.*
                    assert np.array_equal(read(flat, at, params[name].shape), params[name]), name
                else:
                    assert stack.d_ff == 0 and slot.startswith(("ffn.", "ln2.")) and at == 0
        assert np.array_equal(read(flat, lay.top[sublayers.EMBED], (stack.vocab_size, stack.d_model)),
                              params[f"{prefix}embed"])
        pos = params.get(f"{prefix}pos")
        assert (lay.top[sublayers.POS] == -1) == (pos is None)
        if pos is not None:
            assert np.array_equal(read(flat, lay.top[sublayers.POS], pos.shape), pos)
    out_W, out_b = ("classifier.W", "classifier.b") if cfg is ENCODER else ("unembed", "unembed_b")
    top = stacks(cfg)[-1][0].top
    assert np.array_equal(read(flat, top[sublayers.OUT_W], params[out_W].shape), params[out_W])
    assert np.array_equal(read(flat, top[sublayers.OUT_B], params[out_b].shape), params[out_b])


@pytest.mark.parametrize("cfg", [ENCODER, DECODER, SEQ2SEQ], ids=["encoder", "decoder", "seq2seq"])
def test_the_layout_holds_the_configs_sizes_under_its_names(cfg):
    for lay, _, stack in stacks(cfg):
        same = [name for name in sublayers.Layout._fields if hasattr(stack, name)]
        assert {"vocab_size", "n_ctx", "d_model", "n_heads", "d_ff"} <= set(same)
        assert all(getattr(lay, name) == getattr(stack, name) for name in same)
        assert lay.learned_positions == (stack.positional == "learned")
    lay, _, head = stacks(cfg)[-1]                              # the stack with the output layer
    assert lay.n_out == (head.n_classes if head.head == "classify" else head.vocab_size)


def test_the_kernels_view_of_a_block_is_its_arrays_under_the_same_names():
    params, flat = packed(SEQ2SEQ)
    lay = offsets.decoder_layout(SEQ2SEQ)
    assert sublayers.Layer._fields == tuple(slot.replace(".", "_") for slot in sublayers.LAYER_SLOTS)
    for i in range(SEQ2SEQ.decoder.n_layers):
        block = sublayers.layer_views(flat, lay.dec, i)
        for slot, field in zip(sublayers.LAYER_SLOTS, block._fields):
            assert np.array_equal(getattr(block, field), params[f"dec.blocks.{i}.{slot}"]), slot
        cross = decoder_gradient.cross_views(flat, lay, i)
        for slot, field in zip(decoder_gradient.CROSS_SLOTS, cross._fields):
            assert field == slot.replace(".", "_")
            assert np.array_equal(getattr(cross, field), params[f"dec.blocks.{i}.{slot}"]), slot


def test_only_the_original_transformers_blocks_get_a_layout():
    assert offsets.unsupported(ENCODER) is None and offsets.unsupported(SEQ2SEQ) is None
    gpt2 = presets.gpt2(vocab_size=9, n_ctx=6, d_model=4, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="cannot train on the compiled step: .*norm_placement='pre'"):
        offsets.decoder_layout(gpt2)
    with pytest.raises(ValueError, match="trains a classifier"):
        offsets.encoder_layout(DECODER)


@pytest.mark.parametrize("llama_setting, words", [(dict(n_kv_heads=1), "n_kv_heads=1"),
                                                  (dict(gated_ffn=True), "gated_ffn=True"),
                                                  (dict(positional="rotary"), "positional='rotary'")])
def test_the_llama_settings_are_refused_one_by_one(llama_setting, words):
    """Each on the original Transformer's blocks, which the compiled steps otherwise run."""
    import dataclasses

    for cfg, layout in ((DECODER, offsets.decoder_layout), (ENCODER, offsets.encoder_layout)):
        with pytest.raises(ValueError, match=f"cannot train on the compiled step: .*{words}"):
            layout(dataclasses.replace(cfg, **llama_setting))
