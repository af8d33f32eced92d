"""What the decoder page counts and measures about generation (core/lessons/kv_cache.py)."""
import numpy as np
import pytest

from core.lessons import kv_cache


def test_the_anti_diagonal_weight_is_one_for_a_reverser_and_one_over_s_for_a_uniform_head():
    S = 6
    reverser = np.eye(S)[::-1]                          # output position t reads source position S + 1 - t
    cross = np.stack([reverser, np.full((S, S), 1 / S), np.eye(S)])[None]      # (L=1, H=3, T, S)
    np.testing.assert_allclose(kv_cache.anti_diagonal_weight(cross), [[1.0, 1 / S, 0.0]])
    with pytest.raises(ValueError, match="at most as many output positions"):
        kv_cache.anti_diagonal_weight(np.ones((1, 1, 7, 6)) / 6)


@pytest.mark.parametrize("task", ["reverse", "lm"])
def test_the_work_of_each_step_with_and_without_the_cache(task):
    """Step s reads t = P + s positions: without the cache t positions and t² scores; with it the
    prompt's P positions (P² scores) at step 0, then one position scoring t keys."""
    cached, full = kv_cache.opening_generations(task)
    P, n = cached.prompt_len, len(cached.positions_computed)
    t = P + np.arange(n)
    mine, theirs = kv_cache.work(cached), kv_cache.work(full)
    np.testing.assert_array_equal(theirs.positions, t)
    np.testing.assert_array_equal(theirs.scores, t * t)
    np.testing.assert_array_equal(mine.positions, np.r_[P, np.ones(n - 1, int)])
    np.testing.assert_array_equal(mine.scores, np.r_[P * P, t[1:]])
    # the rows each new query attended over are the keys counted
    assert [row.shape[-1] for row in cached.self_attn] == list(t)
    assert kv_cache.largest_logit_difference(cached, full) < 1e-12
