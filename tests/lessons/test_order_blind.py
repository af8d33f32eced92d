"""Why an encoder without positions can only guess on 'increasing' (core/lessons/order_blind.py)."""
import numpy as np
import pytest

from core.lessons import order_blind


def test_each_near_miss_is_its_positive_with_one_neighbouring_pair_swapped():
    positives, negatives = order_blind.near_misses(n_val=200)
    assert len(negatives) == 100
    assert np.all(np.diff(positives, axis=1) > 0)                           # strictly increasing
    np.testing.assert_array_equal(np.sort(negatives, axis=1), positives)    # the same tokens
    assert np.all((negatives != positives).sum(axis=1) == 2)
    assert np.all((np.diff(negatives, axis=1) < 0).sum(axis=1) == 1)        # exactly one descent


@pytest.mark.parametrize("seed", [0, 3])
def test_without_positions_a_near_miss_gets_its_positives_logits_whatever_the_weights(seed):
    assert order_blind.near_miss_gap("none", seed) < 1e-5
    for positional in ("sinusoidal", "learned"):
        assert order_blind.near_miss_gap(positional, seed) > 1e-3


def test_the_first_loss_is_about_ln_2_before_any_step():
    loss = order_blind.initial_loss("sum")
    assert abs(loss - np.log(2)) < 0.2 and loss > 0
