"""The check-yourself markers: the two hands-on exercises, and a count the parameters page asks about."""
import math

import numpy as np
import pytest

from core.lessons import analysis, param_counts
from core.lessons import exercises
from core.lessons import heads


# --- the count the parameters page asks about -----------------------------------------------------

def test_a_fixed_head_width_count_is_the_usual_one_only_when_h_times_d_k_is_d_model():
    assert exercises.mha_param_count_fixed_head_width(512, 8, 64) == param_counts.mha_param_count(512, 8)
    assert exercises.mha_param_count_fixed_head_width(512, 16, 64) == 2 * param_counts.mha_param_count(512, 8)
    with pytest.raises(ValueError, match="n_heads must be a positive whole number"):
        exercises.mha_param_count_fixed_head_width(512, 0, 64)


# --- exercise: sharper first-token head --------------------------------------------------------

def test_first_token_gain_threshold_matches_the_kernels():
    g = exercises.first_token_gain_needed()
    assert 8.0 < g < 8.6                                                   # measured 8.31
    eff = lambda gain: analysis.effective_positions(exercises.first_token_weights(gain, backend="cpu"))[5]
    assert eff(g - 0.01) > 1.1 > eff(g + 0.01)
    assert eff(3.0) == pytest.approx(2 ** 1.824399, abs=1e-5)             # the lesson's table, row 6


@pytest.mark.parametrize("gain, ok", [(3, False), (6, False), (9, True), (20, True), (-9, False)])
def test_check_first_token_gain(gain, ok):
    result = exercises.check_first_token_gain(gain, backend="cpu")
    assert result.ok is ok
    assert "effective positions" in result.explanation


@pytest.mark.parametrize("bad", ["abc", float("inf"), None])
def test_check_first_token_gain_refuses_non_numbers(bad):
    result = exercises.check_first_token_gain(bad, backend="cpu")
    assert not result.ok and "number" in result.explanation


# --- exercise: two positions at once ----------------------------------------------------------

def test_the_lesson_head_passes_and_the_row_is_as_measured():
    Q, K = heads.two_positions(6, 2, 3.0)
    ok, explanation, A = exercises.check_two_position_head(Q, K, backend="cpu")
    assert ok, explanation
    np.testing.assert_allclose(A[3, [0, 2]], 0.446, atol=1e-3)
    np.testing.assert_allclose(A.sum(axis=1), 1.0, atol=1e-12)
    assert A[3, 4:].max() == 0.0                                           # causal: no future


@pytest.mark.parametrize("make, reason", [
    (lambda: heads.first_token(6, 2, 9.0), "uneven"),
    (lambda: heads.uniform(6, 2), "less than"),
    (lambda: heads.two_positions(6, 2, 1.0), "position 2 still gets"),
    (lambda: heads.two_positions(6, 2, 3.0, targets=(2, 4)), "less than"),
])
def test_heads_that_do_something_else_fail_with_a_reason(make, reason):
    Q, K = make()
    ok, explanation, A = exercises.check_two_position_head(Q, K, backend="cpu")
    assert not ok and reason in explanation
    assert A.shape == (6, 6)


def test_two_position_head_shape_errors():
    with pytest.raises(ValueError, match=r"\(T, d_k\)"):
        exercises.check_two_position_head(np.zeros((3, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        exercises.check_two_position_head(np.full((6, 2), math.nan), np.zeros((6, 2)))
