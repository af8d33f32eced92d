"""Row entropy, score rank, score FLOPs and parameter counts."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core.lessons import analysis, param_counts
from core.lessons import heads


# --- row entropy --------------------------------------------------------------------------------

def test_entropy_of_one_hot_uniform_and_masked_rows():
    A = np.array([[1.0, 0.0, 0.0, 0.0],
                  [0.5, 0.5, 0.0, 0.0],
                  [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_array_equal(analysis.row_entropy_bits(A), [0.0, 1.0, 2.0])
    np.testing.assert_allclose(analysis.effective_positions(A), [1.0, 2.0, 4.0])


def test_entropy_keeps_leading_axes_and_never_nans():
    A = np.zeros((2, 3, 5, 5))                     # all-masked rows: zero weights
    H = analysis.row_entropy_bits(A)
    assert H.shape == (2, 3, 5)
    assert np.isfinite(H).all() and (H == 0).all()


@pytest.mark.parametrize("n_keys, bits", [(1, 0.0), (2, 1.0), (4, 2.0), (8, 3.0), (1024, 10.0)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_uniform_row_over_n_keys_holds_exactly_log2_n_bits(n_keys, bits, dtype):
    """In bits, not nats (``ln 8 = 2.08``) and not over the row's full width: the padding of
    masked keys (zeros) adds nothing."""
    A = np.zeros((2, n_keys + 3), dtype=dtype)
    A[:, :n_keys] = 1.0 / n_keys
    assert analysis.row_entropy_bits(A).tolist() == [bits, bits]
    assert analysis.effective_positions(A).tolist() == [n_keys, n_keys]
    assert analysis.row_entropy_bits(np.ones((3, 1), dtype=dtype)).tolist() == [0.0, 0.0, 0.0]


def test_entropy_of_a_dyadic_row_is_exact():
    # 1/2 * 1 + 1/4 * 2 + 2 * (1/8 * 3) = 1.75 bits
    assert analysis.row_entropy_bits([0.125, 0.5, 0.0, 0.25, 0.125]) == 1.75


def test_the_entropy_ceiling_is_log2_of_the_visible_keys():
    np.testing.assert_array_equal(analysis.entropy_ceiling_bits(8), np.log2(np.arange(1.0, 9.0)))
    assert analysis.entropy_ceiling_bits(8)[[0, 1, 3, 7]].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert analysis.entropy_ceiling_bits(8, causal=False).tolist() == [3.0] * 8
    assert analysis.entropy_ceiling_bits(1).tolist() == [0.0]
    # a uniform causal map sits exactly on its ceiling
    A = np.tril(np.ones((8, 8)))
    A /= A.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(analysis.row_entropy_bits(A), analysis.entropy_ceiling_bits(8), rtol=1e-15, atol=0)


def test_entropy_refuses_nan():
    with pytest.raises(ValueError, match="NaN"):
        analysis.row_entropy_bits([[np.nan, 1.0]])


# --- rank ---------------------------------------------------------------------------------------

def test_lesson_score_ranks_are_1_2_2_0():
    Q, K = heads.lesson_heads(T=6, d_k=2)
    assert [analysis.score_rank(q, k) for q, k in zip(Q, K)] == [1, 2, 2, 0]
    np.testing.assert_array_equal(analysis.score_rank(Q, K), [1, 2, 2, 0])   # stacked heads


def test_rank_ignores_rounding_and_scale():
    rng = np.random.default_rng(0)
    Q, K = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    assert analysis.score_rank(Q, K) == 3
    assert analysis.score_rank(1e-12 * Q, 1e9 * K) == 3
    # a rank-1 product whose second column cancels only up to rounding
    Q1 = np.column_stack([Q[:, 0], 0.1 * Q[:, 0]])
    assert analysis.score_rank(Q1, K[:, :2]) == 1
    assert analysis.score_rank(np.zeros((4, 2)), K[:4, :2]) == 0


def test_rank_needs_matching_widths():
    with pytest.raises(ValueError, match="share d_k"):
        analysis.score_rank(np.ones((3, 2)), np.ones((3, 4)))


# --- FLOPs --------------------------------------------------------------------------------------

def test_one_wide_head_costs_the_same_as_h_narrow_heads():
    cost = analysis.wide_vs_narrow_score_flops(T=1024, d_model=512, n_heads=8)
    assert cost.one_wide_head == cost.narrow_heads == 1073741824
    assert cost.d_k == 64


def test_flops_refuse_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="cannot be split evenly"):
        analysis.wide_vs_narrow_score_flops(16, 512, 3)


# --- MHA parameters -----------------------------------------------------------------------------

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


def test_the_public_api_counts_parameters_under_analysis():
    assert analysis.mha_param_count(512, 8) == 4 * 512 ** 2        # the design's analysis.mha_param_count


def test_mha_params_refuse_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="384 cannot be split evenly into 5 heads"):
        param_counts.mha_param_count(384, 5)


# --- blocks and models --------------------------------------------------------------------------

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
    from dataclasses import replace
    untied = param_counts.model_param_count(replace(base, tied_output=False)).total
    assert untied - tied == 37000 * 512
    unshared = param_counts.model_param_count(replace(base, shared_embeddings=False)).total
    assert unshared - tied == 37000 * 512
    learned = param_counts.model_param_count(replace(base, positional="learned", max_positions=256)).total
    assert learned - tied == 2 * 256 * 512                  # one table per stack
    gpt = param_counts.TransformerSpec(architecture="decoder-only", d_model=768, n_heads=12, d_ff=3072,
                                   n_encoder_layers=0, n_decoder_layers=12, vocab_size=50257,
                                   positional="learned", max_positions=1024, final_layernorm=True)
    counted = param_counts.model_param_count(gpt)
    assert "decoder cross-attention" not in counted.parts
    assert counted.total == 124_439_808                     # the released GPT-2 small checkpoint


def test_spec_refuses_inconsistent_models():
    with pytest.raises(ValueError, match="no decoder layers"):
        param_counts.TransformerSpec(architecture="encoder-only", n_encoder_layers=2, n_decoder_layers=2)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        param_counts.TransformerSpec(d_model=510, n_heads=8)
    with pytest.raises(ValueError, match="Unknown positional"):
        param_counts.TransformerSpec(positional="rotary")


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


def test_exercise_5_grow_heads():
    before, after = analysis.grow_heads(8, 16, 64, 1024, keep="d_k")
    assert (before.d_model, after.d_model, after.d_k) == (512, 1024, 64)
    assert after.parameters == 4 * before.parameters == 4 * 1024 ** 2
    assert after.score_flops == 2 * before.score_flops == 2 * (2 * 1024 ** 2 * 512)
    same_before, same_after = analysis.grow_heads(8, 16, 64, 1024, keep="d_model")
    assert (same_after.d_model, same_after.d_k) == (512, 32) and same_after.parameters == same_before.parameters
    assert same_after.score_flops == same_before.score_flops == 1_073_741_824   # the lesson's T=1024, d=512
    with pytest.raises(ValueError, match="cannot be split evenly"):
        analysis.grow_heads(8, 7, 64, 16, keep="d_model")
    # read with both kept: 16 heads of 64 in a 512-wide model, W_Q 512 x 1024 and W_O 1024 x 512
    _, both = analysis.grow_heads(8, 16, 64, 1024, keep="both")
    assert (both.d_model, both.d_k, both.n_heads) == (512, 64, 16)
    assert both.parameters == 2 * before.parameters == 2_097_152
    assert both.score_flops == 2 * before.score_flops
    _, biased = analysis.grow_heads(8, 16, 64, 1024, keep="both", bias=True)
    assert biased.parameters == 2_097_152 + 3 * 1024 + 512


def test_bert_base_is_12_blocks_of_85M_plus_embeddings():
    split = param_counts.blocks_and_embeddings(param_counts.BERT_BASE)
    assert split.n_blocks == 12 and round(split.blocks / 1e6) == 85
    assert split.embeddings == (30522 + 512 + 2) * 768 + 2 * 768 and split.other_parts == ("pooler",)
    assert split.blocks + split.embeddings + split.other == param_counts.model_param_count(param_counts.BERT_BASE).total


def test_interaction_paths():
    p = analysis.interaction_paths(10)
    assert (p.attention_path, p.rnn_path, p.attention_sequential, p.rnn_sequential) == (1, 9, 1, 10)
    with pytest.raises(ValueError):
        analysis.interaction_paths(1)
