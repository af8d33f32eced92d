"""Head scores (core.model.head_scores) on hand-built maps: a perfect map scores one, a uniform
causal map its average, and the induction targets follow the tokens, not the positions."""
import numpy as np
import pytest

from core.lessons import real_model as rm
from core.model import head_scores as hs
from core.training import induction as I

SETUP = I.InductionSetup()
N, T = SETUP.half, 2 * SETUP.half - 1


def _uniform_causal(T):
    A = np.tril(np.ones((T, T)))
    return A / A.sum(axis=1, keepdims=True)


def test_a_perfect_induction_map_scores_one_and_a_uniform_map_its_average():
    tokens = I.make_data(3, seed=1)[0]                                  # (3, T)
    perfect = np.zeros((3, T, T))
    for t in range(T):
        perfect[:, t, t - N + 1 if t >= N else t] = 1.0                 # second half: right after the copy
    assert hs.induction(perfect, tokens) == pytest.approx(1.0)
    uniform = np.broadcast_to(_uniform_causal(T), (3, T, T))
    expected_prev, expected_ind = I.uniform_baselines(T, N)
    assert expected_ind == pytest.approx(np.mean([1 / (t + 1) for t in range(N, T)]))
    assert hs.induction(uniform, tokens) == pytest.approx(expected_ind, rel=1e-12)
    assert hs.previous_token(uniform).mean() == pytest.approx(expected_prev, rel=1e-12)
    previous = np.zeros((3, T, T))
    previous[:, np.arange(1, T), np.arange(T - 1)] = 1.0
    previous[:, 0, 0] = 1.0
    assert hs.previous_token(previous).mean() == pytest.approx(1.0)
    assert hs.induction(previous, tokens) == pytest.approx(0.0)   # the copy, not the one after it
    # leading axes (layer, head) are kept
    stacked = np.stack([perfect, uniform])[:, :, None]                  # (2, B, 1, T, T) -> layer-like axis
    assert hs.induction(np.moveaxis(stacked, 1, 2), tokens).shape == (2, 1)


def test_induction_targets_follow_the_tokens_not_the_positions():
    tokens = np.array([[4, 7, 4, 9, 7]])
    targets = hs.induction_targets(tokens)[0]
    assert np.argwhere(targets).tolist() == [[2, 1], [4, 2]]           # 4 was followed by 7; 7 by 4
    with pytest.raises(ValueError, match="No token repeats"):
        hs.induction(np.ones((1, 3, 3)) / 3, np.array([[1, 2, 3]]))


def test_the_two_pages_score_a_previous_token_map_alike():
    """The real-model page's detector and the induction page's measure read one formula."""
    A = np.zeros((1, 2, 1, 2 * N, 2 * N))                              # (L, B, H, T, T)
    A[..., np.arange(1, 2 * N), np.arange(2 * N - 1)] = 1.0
    A[..., 0, 0] = 1.0
    assert rm.head_scores(A, N)["previous-token"] == pytest.approx(1.0)
    assert rm.head_scores(A, N)["duplicate-token"] == pytest.approx(0.0)
    assert hs.previous_token(A[0, :, 0]).mean() == pytest.approx(1.0)
