"""The small measures the lesson pages quote: a softmax row's largest gradient, the variance of raw
scores, each head's QK and OV circuits, the sinusoidal frequencies, the closest call among distant
positions, and a shuffle that always moves something."""
import numpy as np
import pytest

from core.kernels import reference as ref
from core.lessons import analysis, positions


def test_a_softmax_row_passes_back_a_quarter_at_most_and_nothing_when_one_hot():
    A = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(analysis.softmax_gradient_size(A), [0.0, 0.25, 0.25, 2 / 9])
    rng = np.random.default_rng(0)
    S = rng.normal(size=(50, 7)) * rng.uniform(0.1, 20, size=(50, 1))
    A = ref.softmax(S)
    J = A[:, :, None] * (np.eye(7)[None] - A[:, None, :])                 # da_i/ds_j, row by row
    np.testing.assert_allclose(analysis.softmax_gradient_size(A), np.abs(J).max(axis=(1, 2)), atol=1e-15)


def test_the_raw_scores_variance_grows_as_d_k():
    rng = np.random.default_rng(1)
    for d_k in (1, 16, 64):
        Q, K = rng.normal(size=(400, d_k)), rng.normal(size=(400, d_k))
        assert analysis.dot_product_variance(Q, K) == pytest.approx(d_k, rel=0.1)
    with pytest.raises(ValueError, match="same width"):
        analysis.dot_product_variance(np.ones((3, 2)), np.ones((3, 4)))


def test_each_heads_circuits_are_its_own_columns_and_rows():
    rng = np.random.default_rng(2)
    d, H, d_k = 6, 3, 2
    W_Q, W_K, W_V = (rng.normal(size=(d, H * d_k)) for _ in range(3))
    W_O = rng.normal(size=(H * d_k, 5))
    qk, ov = analysis.qk_circuits(W_Q, W_K, H), analysis.ov_circuits(W_V, W_O, H)
    assert qk.shape == (H, d, d) and ov.shape == (H, d, 5)
    for h in range(H):
        cols = slice(h * d_k, (h + 1) * d_k)
        np.testing.assert_allclose(qk[h], W_Q[:, cols] @ W_K[:, cols].T, atol=1e-12)
        np.testing.assert_allclose(ov[h], W_V[:, cols] @ W_O[cols], atol=1e-12)
    np.testing.assert_allclose(ov.sum(0), W_V @ W_O, atol=1e-12)          # the blocks add up to W_V W_O
    with pytest.raises(ValueError):
        analysis.ov_circuits(W_V, W_O[:-1], H)


def test_the_frequencies_are_the_codes_own():
    for d, base in ((2, 10000.0), (8, 10000.0), (128, 500.0)):
        w = positions.frequencies(d, base)
        assert len(w) == d // 2 and w[0] == 1.0
        np.testing.assert_allclose(ref.sinusoidal(2, d, base)[1, 0::2], np.sin(w), atol=1e-12)
    with pytest.raises(ValueError, match="base"):
        positions.frequencies(8, 1.0)


def test_the_closest_call_is_none_when_every_closest_pair_is_neighbours():
    widths = [32, 64]
    pairs = positions.collisions_by_width(16, widths)
    assert all(p.j - p.i == 1 for p in pairs) and positions.worst_collision(pairs, widths) is None
    pairs = positions.collisions_by_width(100, [2, 64])
    found = positions.worst_collision(pairs, [2, 64])
    assert found.d_model == 2 and found.pair.j - found.pair.i == 44
    assert found.neighbour_distance == pytest.approx(2 * np.sin(0.5))    # one radian apart on the unit circle


@pytest.mark.parametrize("words", [["a", "b"], ["a", "b", "c"], ["x", "x", "y"], ["the", "cat", "saw", "the", "dog"]])
def test_a_shuffle_is_another_order_of_the_same_words(words):
    seen = [words]
    for seed in range(6):
        out = positions.shuffled(words, seed, unlike=seen[-1])
        assert sorted(out) == sorted(words) and out != words
        if len(words) > 2:
            assert out != seen[-1]                                        # a third order exists: a new one
        seen.append(out)
    assert positions.shuffled(["a", "a"], 0) == ["a", "a"]                 # one order only

