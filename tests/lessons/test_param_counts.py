"""Parameter counts: multi-head attention (packed and head by head), a block, whole models read off
their configs (published presets, the calculator's choices, loaded checkpoints), and the lesson's toy."""
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core.lessons import param_counts
from core.model import config as C
from core.model import decoder, presets


# --- multi-head attention -----------------------------------------------------------------------

def divisor_pairs():
    return st.integers(1, 96).flatmap(
        lambda d: st.tuples(st.just(d), st.sampled_from([h for h in range(1, d + 1) if d % h == 0])))


@settings(max_examples=60, deadline=None)
@given(divisor_pairs(), st.booleans())
def test_mha_params_do_not_depend_on_head_count(pair, bias):
    d_model, n_heads = pair
    count = param_counts.mha_param_count(d_model, n_heads, bias)
    assert count == param_counts.mha_param_count(d_model, 1, bias)
    assert count == 4 * d_model ** 2 + (4 * d_model if bias else 0)
    # the same number, counted from actual arrays of each head's shapes
    arrays = [np.zeros(shape) for shape in param_counts.mha_param_shapes(d_model, n_heads, bias).values()]
    assert sum(a.size for a in arrays) == count


def test_mha_params_are_counted_from_real_per_head_arrays():
    """Independently of mha_param_shapes: build the heads as the lesson writes them."""
    d_model, H = 384, 6
    d_k = d_model // H
    per_head = [np.zeros((d_model, d_k)) for _ in range(3 * H)]     # W_Q^h, W_K^h, W_V^h
    W_O = np.zeros((H * d_k, d_model))
    assert sum(a.size for a in per_head) + W_O.size == param_counts.mha_param_count(d_model, H) == 589824
    assert param_counts.mha_param_count(4, 2) == 64                    # the lesson's toy
    assert param_counts.mha_param_count(512, 8) == 1_048_576


def test_mha_params_refuse_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="384 cannot be split evenly into 5 heads"):
        param_counts.mha_param_count(384, 5)


# --- attention whose heads keep their own width ---------------------------------------------------

def arrays(d_model, n_heads, d_k, bias):
    """The arrays of such a layer, allocated: W_Q, W_K, W_V (d_model, H·d_k), W_O (H·d_k, d_model)."""
    wide = n_heads * d_k
    found = [np.zeros((d_model, wide)) for _ in range(3)] + [np.zeros((wide, d_model))]
    if bias:
        found += [np.zeros(wide) for _ in range(3)] + [np.zeros(d_model)]
    return found


@pytest.mark.parametrize("d_model, n_heads, d_k", [(512, 16, 64), (512, 8, 64), (96, 3, 7), (8, 1, 32), (1, 5, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_count_of_heads_of_their_own_width_is_the_size_of_the_arrays(d_model, n_heads, d_k, bias):
    built = sum(a.size for a in arrays(d_model, n_heads, d_k, bias))
    assert param_counts.mha_param_count_of_width(d_model, n_heads, d_k, bias) == built


@pytest.mark.parametrize("bias", [False, True])
def test_heads_that_split_d_model_give_the_usual_count(bias):
    for d_model, n_heads in ((512, 8), (384, 6), (64, 16), (4, 2)):
        assert param_counts.mha_param_count_of_width(d_model, n_heads, d_model // n_heads, bias) == \
            param_counts.mha_param_count(d_model, n_heads, bias)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_a_size_that_is_not_a_positive_whole_number_is_refused(bad):
    for args in ((bad, 2, 4), (8, bad, 4), (8, 2, bad)):
        with pytest.raises(ValueError, match="positive whole number"):
            param_counts.mha_param_count_of_width(*args)


# --- blocks and whole models ------------------------------------------------------------------

def test_block_counts_by_sublayer():
    enc = param_counts.block_param_count(512, 8, 2048)
    assert (enc.self_attention, enc.cross_attention, enc.ffn, enc.layernorms) == (
        4 * 512**2 + 4 * 512, 0, 2 * 512 * 2048 + 2048 + 512, 2 * 2 * 512)
    dec = param_counts.block_param_count(512, 8, 2048, cross_attention=True)
    assert dec.total - enc.total == 4 * 512**2 + 4 * 512 + 2 * 512
    bare = param_counts.block_param_count(512, 8, 2048, bias=False)
    assert bare.total == 4 * 512**2 + 2 * 512 * 2048 + 4 * 512
    assert enc.ffn / enc.total > 0.66              # with d_ff = 4d, two thirds of a block is FFN


@pytest.mark.parametrize("spec, tolerance", [
    (param_counts.TRANSFORMER_BIG, 0.02),
    (param_counts.BERT_BASE, 0.02),
    # The base model's 65M cannot be reached from the stated shapes with a 37000-token vocabulary:
    # the count is 63.08M (-2.95%). For base and big to both sit within 2% the vocabulary would
    # have to be 38.2k-39.9k; we keep the paper's "about 37000" and say so instead.
    (param_counts.TRANSFORMER_BASE, 0.03),
])
def test_published_totals(spec, tolerance):
    assert abs(param_counts.relative_error_to_published(spec)) < tolerance


def test_published_models_exact_arithmetic():
    base = param_counts.model_param_count(param_counts.TRANSFORMER_BASE)
    assert base.total == 63_082_496
    assert base.parts["token embeddings"] == 37000 * 512
    assert base.parts["position embeddings"] == 0          # sinusoidal: nothing to learn
    assert base.parts["output projection"] == 0            # tied to the embedding
    bert = param_counts.model_param_count(param_counts.BERT_BASE)
    assert bert.total == 109_482_240
    layers = sum(v for k, v in bert.parts.items() if k.startswith("encoder"))
    assert layers == 85_054_464                             # "about 85M plus embeddings"
    assert sum(bert.parts.values()) == bert.total
    assert sum(share for _, _, share in bert.rows()) == pytest.approx(1.0)


def test_model_variants_change_the_parts_they_should():
    base = param_counts.TRANSFORMER_BASE
    tied = param_counts.model_param_count(base).total
    untied = param_counts.model_param_count(replace(base, stack=replace(base.stack, tied_unembed=False))).total
    assert untied - tied == 37000 * 512
    unshared = param_counts.model_param_count(replace(base, shared_embeddings=False)).total
    assert unshared - tied == 37000 * 512
    learned = param_counts.model_param_count(replace(
        base, stack=replace(base.stack, positional="learned", n_ctx=256),
        encoder=replace(base.encoder, positional="learned", n_ctx=256))).total
    assert learned - tied == 2 * 256 * 512                  # one table per stack
    counted = param_counts.model_param_count(presets.gpt2())
    assert "decoder cross-attention" not in counted.parts
    assert counted.total == 124_439_808                     # the released GPT-2 small checkpoint


def test_a_whole_model_refuses_stacks_that_do_not_pair():
    base = param_counts.TRANSFORMER_BASE
    with pytest.raises(ValueError, match="source stack attends both ways"):
        replace(base, encoder=base.stack)
    with pytest.raises(ValueError, match="share d_model"):
        replace(base, encoder=replace(base.encoder, d_model=256, n_heads=4))
    with pytest.raises(ValueError, match="share its vocabulary, got 100 and 37000"):
        replace(base, encoder=replace(base.encoder, vocab_size=100))
    replace(base, encoder=replace(base.encoder, vocab_size=100), shared_embeddings=False)   # two tables: fine
    with pytest.raises(ValueError, match="has one stack"):
        param_counts.WholeModel(base.stack, shared_embeddings=True)
    with pytest.raises(ValueError, match="Unknown architecture"):
        param_counts.with_choices(base, "decoder-decoder", "sinusoidal", True, True)
    with pytest.raises(ValueError, match="Unknown positional"):
        param_counts.with_choices(base, "encoder-only", "rotary", True, True)


def test_packed_split_is_the_lessons_48_plus_16():
    split = param_counts.packed_param_split(4, 2)
    assert (split.per_matrix, split.qkv, split.out, split.total) == (16, 48, 16, 64)
    assert param_counts.packed_param_split(512, 8).total == param_counts.mha_param_count(512, 8) == 1_048_576


def test_slice_error_is_zero_only_for_the_right_column_blocks():
    rng = np.random.default_rng(0)
    X, per_head = rng.normal(size=(5, 6)), [rng.normal(size=(6, 2)) for _ in range(3)]
    W = np.hstack(per_head)                                     # (6, 3*2): head h in columns 2h, 2h+1
    assert param_counts.packed_slice_error(X, W, per_head) == 0.0
    assert param_counts.packed_slice_error(X, W[:, [1, 0, 2, 3, 4, 5]], per_head) > 0.1
    with pytest.raises(ValueError, match="H\\*d_k"):
        param_counts.packed_slice_error(X, W[:, :4], per_head)


def test_bert_base_is_12_blocks_of_85M_plus_embeddings():
    split = param_counts.blocks_and_embeddings(param_counts.BERT_BASE)
    assert split.n_blocks == 12 and round(split.blocks / 1e6) == 85
    assert split.embeddings == (30522 + 512 + 2) * 768 + 2 * 768 and split.other_parts == ("pooler",)
    assert split.blocks + split.embeddings + split.other == param_counts.model_param_count(param_counts.BERT_BASE).total


# --- the count of a config is the size of its arrays ----------------------------------------------

ROWS = {"embed": "token embeddings", "pos": "position embeddings", "token_type": "segment embeddings",
        "embed_ln": "embedding LayerNorm", "ln_final": "final LayerNorms", "unembed": "output projection",
        "unembed_b": "output projection", "pooler": "pooler", "classifier": "classifier"}
SUBLAYERS = {"attn": "self-attention", "cross": "cross-attention", "ffn": "FFN"}       # the rest: norms


def parts_of_the_arrays(cfg) -> Counter:
    """The table's rows summed from the arrays a config builds, read by their names alone."""
    counts = Counter()
    for name, shape in decoder.param_shapes(cfg).items():
        parts = name.split(".")
        role = "decoder" if getattr(cfg, "causal", True) else "encoder"
        if parts[0] in ("enc", "dec"):
            role, parts = ("encoder" if parts[0] == "enc" else "decoder"), parts[1:]
        norms = param_counts.norms_label(getattr(cfg, "norm", "layernorm"))
        part = (f"{role} {SUBLAYERS.get(parts[2], norms)}" if parts[0] == "blocks"
                else ROWS[parts[0]].replace("LayerNorm", norms[:-1]))
        counts[part] += math.prod(shape)
    return counts


STACKS = {
    "encoder classifier": presets.encoder_classifier(vocab_size=7, n_ctx=5, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                                                     n_classes=3, positional="learned"),
    "decoder": presets.decoder_lm(11, 6, d_model=8, n_heads=2, d_ff=12, n_layers=3),
    "attention-only": presets.attention_only(9, 6, d_model=8, n_heads=2, n_layers=2),
    "gpt2": presets.gpt2(vocab_size=13, n_ctx=7, d_model=8, n_heads=2, n_layers=2),
    "bert": C.TransformerConfig(vocab_size=13, n_ctx=7, d_model=8, n_heads=2, d_ff=16, n_layers=2, positional="learned",
                                causal=False, head="none", n_token_types=2, embed_ln=True, pooler=True),
    "rmsnorm, no biases, no positions": C.TransformerConfig(vocab_size=13, n_ctx=7, d_model=8, n_heads=2, d_ff=16,
                                                            n_layers=2, norm="rmsnorm", positional="none", bias=False,
                                                            final_ln=True, unembed_b=True),
    "seq2seq": presets.seq2seq(7, 5, 6, 4, d_model=8, n_heads=2, d_ff=12, n_layers=2, positional="learned"),
    "llama": C.TransformerConfig(vocab_size=13, n_ctx=7, d_model=12, n_heads=6, n_kv_heads=2, d_ff=10, n_layers=2,
                                 norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                                 positional="rotary", tied_unembed=True, final_ln=True, bias=False),
    "gated, grouped, biased": C.TransformerConfig(vocab_size=13, n_ctx=7, d_model=12, n_heads=6, n_kv_heads=3,
                                                  d_ff=10, n_layers=2, gated_ffn=True, activation="gelu_tanh",
                                                  unembed_b=True),
}


@pytest.mark.parametrize("cfg", list(STACKS.values()), ids=list(STACKS))
def test_a_configs_count_is_the_size_of_its_arrays_row_by_row(cfg):
    counted = param_counts.model_param_count(cfg)
    assert counted.total == decoder.param_count(cfg)
    assert Counter({k: v for k, v in counted.parts.items() if v}) == parts_of_the_arrays(cfg)


SMOLLM2 = C.TransformerConfig(vocab_size=49152, n_ctx=8192, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536,
                              n_layers=30, norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                              positional="rotary", rope_base=100000.0, tied_unembed=True, final_ln=True, bias=False)


def test_smollm2s_config_counts_its_published_134515008():
    """9 query heads over 3 key/value heads of 64: W_K and W_V are 576 x 192; the gated FFN three
    576 x 1536 matrices; two RMSNorm gains a layer and a final one; the embeddings tied."""
    counted = param_counts.model_param_count(SMOLLM2)
    assert counted.total == 134_515_008 == C.param_count(SMOLLM2)
    assert counted.parts == {"token embeddings": 49152 * 576, "position embeddings": 0,
                             "decoder self-attention": 30 * (2 * 576 * 576 + 2 * 576 * 192),
                             "decoder FFN": 30 * 3 * 576 * 1536, "decoder RMSNorms": 30 * 2 * 576,
                             "final RMSNorms": 576, "output projection": 0}
    layer = param_counts.block_param_count(576, 9, 1536, bias=False, norm="rmsnorm", n_kv_heads=3, gated_ffn=True)
    assert layer.total == 3_540_096


def test_grouped_heads_and_a_gated_ffn_by_their_formulas():
    assert param_counts.mha_param_count(576, 9, n_kv_heads=9) == param_counts.mha_param_count(576, 9) == 4 * 576 ** 2
    assert param_counts.mha_param_count(576, 9, n_kv_heads=1) == 2 * 576 ** 2 + 2 * 576 * 64
    assert param_counts.mha_param_count(576, 9, True, 3) == 2 * 576 ** 2 + 2 * 576 * 192 + 2 * 576 + 2 * 192
    assert param_counts.ffn_param_count(576, 1536, bias=True, gated=True) == 3 * 576 * 1536 + 2 * 1536 + 576
    for bad in (2, 0, 1.5):
        with pytest.raises(ValueError, match="divides the 9 query heads"):
            param_counts.mha_param_count(576, 9, n_kv_heads=bad)


def test_a_loaded_checkpoints_config_is_counted_as_it_is():
    assert param_counts.model_param_count(param_counts.BERT_BASE.stack) == param_counts.model_param_count(
        param_counts.BERT_BASE)
    assert param_counts.model_param_count(presets.gpt2()).total == C.param_count(presets.gpt2())


# --- the calculator's choices -----------------------------------------------------------------------

CUSTOM = param_counts.WholeModel(C.TransformerConfig(vocab_size=100, n_ctx=16, d_model=8, n_heads=2, d_ff=32,
                                                     n_layers=3, bias=False, causal=False, head="none"))


@pytest.mark.parametrize("model", [CUSTOM, *param_counts.MODEL_PRESETS.values()], ids=lambda m: m.name)
def test_a_models_own_choices_give_it_back(model):
    assert param_counts.with_choices(model, *param_counts.choices(model)) == model


def test_the_presets_start_from_their_papers_choices_and_tied_where_nothing_is_to_tie():
    assert param_counts.choices(param_counts.TRANSFORMER_BASE) == ("encoder-decoder", "sinusoidal", True, True)
    assert param_counts.choices(param_counts.BERT_BASE) == ("encoder-only", "learned", False, True)
    assert param_counts.choices(CUSTOM) == ("encoder-only", "sinusoidal", False, True)
    untied = param_counts.with_choices(param_counts.TRANSFORMER_BASE, "decoder-only", "learned", True, False)
    assert param_counts.choices(untied) == ("decoder-only", "learned", True, False)


@pytest.mark.parametrize("positional", param_counts.POSITIONAL)
def test_each_choice_makes_the_model_it_names(positional):
    one = param_counts.with_choices(CUSTOM, "decoder-only", positional, True, False)
    assert one.architecture == "decoder-only" and one.encoder is None
    assert (one.stack.causal, one.stack.positional, one.stack.head, one.stack.tied_unembed) == (True, positional, "lm",
                                                                                                 False)
    assert param_counts.model_param_count(one).total == C.param_count(one.stack)
    pair = param_counts.with_choices(CUSTOM, "encoder-decoder", positional, True, False)
    assert pair.architecture == "encoder-decoder" and pair.shared_embeddings
    trainable = presets.seq2seq(100, 16, 100, 16, d_model=8, n_heads=2, d_ff=32, n_layers=3, positional=positional)
    trainable = replace(trainable, encoder=replace(trainable.encoder, bias=False),
                        decoder=replace(trainable.decoder, bias=False, unembed_b=False))
    assert (pair.encoder, pair.stack) == (trainable.encoder, trainable.decoder)
    # the trainable encoder-decoder has a token table per stack; this one shares one
    assert param_counts.model_param_count(pair).total == decoder.param_count(trainable) - 100 * 8
    tied = param_counts.with_choices(CUSTOM, "encoder-only", positional, True, True)
    assert tied.stack.tied_unembed and param_counts.model_param_count(tied).parts["output projection"] == 0


def test_an_encoder_decoder_keeps_each_stacks_layers_and_the_inputs_pieces_once():
    base = param_counts.TRANSFORMER_BASE
    three = replace(base, encoder=replace(base.encoder, n_layers=3))
    assert param_counts.with_choices(three, "encoder-only", "sinusoidal", False, True).stack.n_layers == 3
    assert param_counts.with_choices(three, "decoder-only", "sinusoidal", False, True).stack.n_layers == 6
    bert = param_counts.with_choices(param_counts.BERT_BASE, "encoder-decoder", "learned", False, True)
    parts = param_counts.model_param_count(bert).parts
    assert (parts["segment embeddings"], parts["embedding LayerNorm"], parts["pooler"]) == (2 * 768, 2 * 768,
                                                                                            768 * 768 + 768)
    assert parts["token embeddings"] == 30522 * 768 and parts["position embeddings"] == 2 * 512 * 768
