"""Row entropy, score rank, score FLOPs, the growth of heads and interaction paths (parameter counts:
test_param_counts.py)."""
import numpy as np
import pytest

from core.lessons import analysis
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


# --- MHA parameters under the public name -------------------------------------------------------

def test_the_public_api_counts_parameters_under_analysis():
    assert analysis.mha_param_count(512, 8) == 4 * 512 ** 2        # the design's analysis.mha_param_count


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


def test_interaction_paths():
    p = analysis.interaction_paths(10)
    assert (p.attention_path, p.rnn_path, p.attention_sequential, p.rnn_sequential) == (1, 9, 1, 10)
    with pytest.raises(ValueError):
        analysis.interaction_paths(1)
