"""Hand-set heads: the lesson's four heads and two-head pipeline reproduce the lesson's numbers.

Attention weights come from ``core.kernels.reference`` (the kernels are tested elsewhere).
"""
import numpy as np
import pytest

from core.lessons import heads
from core.kernels import reference
from core.lessons.analysis import row_entropy_bits


def causal_weights(Q, K):
    """The lesson's head: ``softmax(Q K^T / sqrt(d_k) + causal mask)``."""
    return reference.softmax(reference.scaled_scores(Q, K, reference.causal_mask(Q.shape[-2])))


@pytest.fixture(scope="module")
def lesson_weights():
    Q, K = heads.lesson_heads(T=6, d_k=2, gain=3.0)          # (4, 6, 2) each
    return causal_weights(Q, K)                               # (4, 6, 6)


def test_uniform_head_row_4_is_the_prefix_average(lesson_weights):
    np.testing.assert_allclose(lesson_weights[3, 3], [0.25, 0.25, 0.25, 0.25, 0, 0], atol=1e-15)


def test_row_entropy_table_matches_the_lesson(lesson_weights):
    # columns: t, log2 t, heads 1..4 (bits), as printed by the lesson
    expected = np.array([
        [1.000000, 0.000000, 0.000000, 0.000000, 0.000000, 0.000000],
        [2.000000, 1.000000, 0.490928, 0.241602, 0.241602, 1.000000],
        [3.000000, 1.584963, 0.901880, 0.466890, 0.242633, 1.584963],
        [4.000000, 2.000000, 1.252685, 0.467871, 0.242689, 2.000000],
        [5.000000, 2.321928, 1.556962, 0.467924, 0.243721, 2.321928],
        [6.000000, 2.584963, 1.824399, 0.468905, 0.468905, 2.584963],
    ])
    t = np.arange(1, 7)
    table = np.column_stack([t, np.log2(t), row_entropy_bits(lesson_weights).T])
    np.testing.assert_allclose(table, expected, atol=5e-7)


def test_lesson_heads_point_where_their_names_say(lesson_weights):
    first, previous, self_, _ = lesson_weights
    rows = np.arange(1, 6)                                    # rows 2..6 (0-based 1..5)
    assert (first[rows].argmax(axis=1) == 0).all()
    assert (previous[rows].argmax(axis=1) == rows - 1).all()
    assert (self_.argmax(axis=1) == np.arange(6)).all()


def test_every_row_sums_to_one_and_the_future_is_exactly_zero(lesson_weights):
    np.testing.assert_allclose(lesson_weights.sum(axis=-1), 1.0, atol=1e-12)
    assert (lesson_weights[:, np.triu_indices(6, k=1)[0], np.triu_indices(6, k=1)[1]] == 0).all()


def test_two_head_pipeline_matches_the_lesson():
    p = heads.two_head_pipeline()
    result = reference.multi_head_attention(p.X, p.W_Q, p.W_K, p.W_V, p.W_O, p.n_heads,
                                            mask=reference.causal_mask(4))
    concat = np.array([
        [0.000000, 0.000000, 1.000000, 0.000000],
        [0.000000, 0.000000, 0.500000, 0.500000],
        [0.998277, 0.000000, 0.333333, 0.333333],
        [0.001717, 0.996564, 0.250000, 0.250000],
    ])
    output = np.array([
        [1.000000, 0.000000, -1.000000, 0.000000],
        [0.500000, 0.000000, -0.500000, 0.500000],
        [1.331611, 0.000000, -0.333333, 0.333333],
        [0.251717, 0.996564, -0.250000, 0.250000],
    ])
    np.testing.assert_allclose(result["concat"], concat, atol=5e-7)
    np.testing.assert_allclose(result["output"], output, atol=5e-7)


def test_packed_W_Q_slices_are_the_per_head_queries():
    p = heads.two_head_pipeline()
    Q_all = p.X @ p.W_Q                                       # X = I: one matmul, every head
    np.testing.assert_array_equal(Q_all[:, :2], heads.self_position(4, 2)[0])


def test_two_positions_splits_row_4_between_positions_1_and_3():
    for d_k in (1, 2, 4):
        A = causal_weights(*heads.two_positions(6, d_k=d_k, gain=3.0))
        row = A[3]                                            # row 4 (1-based)
        assert row[0] == pytest.approx(row[2], abs=1e-15)     # equal scores, equal weight
        assert row[0] + row[2] > 0.75
        assert max(row[1], row[3]) < 0.1
        assert row[4] == row[5] == 0.0
    # at the lesson's d_k = 2, gain 3: e^m / (2 e^m + 2), m = 3 / sqrt 2
    A = causal_weights(*heads.two_positions(6, d_k=2))
    m = np.exp(3 / np.sqrt(2))
    assert A[3, 0] == pytest.approx(m / (2 * m + 2), rel=1e-12)
    # the price: about one bit more than a one-hot head
    assert 1.0 < row_entropy_bits(A[3]) < 1.5


def test_a_circle_code_cannot_skip_the_middle_position():
    """Why two_positions needs a marker: a circle-code query aimed between 1 and 3 lands on 2."""
    T = 6
    K = heads.circle_code(np.arange(1, T + 1), T)             # (T, 2)
    q = (K[0] + K[2]) / 2                                     # aim at both
    A = reference.softmax(K[:4] @ q / np.sqrt(2))
    assert A.argmax() == 1                                    # position 2 wins


def test_extra_feature_columns_stay_zero_and_change_only_the_scale():
    for name in heads.PRESETS:
        Q, K = heads.build_head(name, 5, d_k=6)
        assert Q.shape == K.shape == (5, 6)
        assert not Q[:, 2:].any() and not K[:, 2:].any()
    Q2, K2 = heads.previous_token(5, d_k=2)
    Q6, K6 = heads.previous_token(5, d_k=6)
    np.testing.assert_allclose(reference.scaled_scores(Q6, K6, scale=1.0),
                               reference.scaled_scores(Q2, K2, scale=1.0))


def test_gain_sharpens_the_first_token_head():
    """Lesson exercise 6: a larger key magnitude spends fewer bits at t = 6."""
    bits = [row_entropy_bits(causal_weights(*heads.first_token(6, 2, g)))[5] for g in (3, 6, 9)]
    assert bits[0] == pytest.approx(1.824399, abs=5e-7)
    assert bits[0] > bits[1] > bits[2]


def test_presets_refuse_what_they_cannot_draw():
    with pytest.raises(ValueError, match="d_k >= 2"):
        heads.previous_token(6, d_k=1)
    with pytest.raises(ValueError, match="T must be"):
        heads.first_token(0)
    with pytest.raises(ValueError, match="between 1 and T"):
        heads.two_positions(3)                                # row 4 does not exist
    with pytest.raises(ValueError, match="shape \\(4, 2\\)"):
        heads.custom(4, 2, Q=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        heads.custom(2, 1, K=[[np.nan], [0.0]])
    with pytest.raises(ValueError, match="Unknown head preset"):
        heads.build_head("nope", 4)


def test_custom_returns_what_was_typed():
    Q, K = heads.custom(2, 2, Q=[[1, 2], [3, 4]])
    np.testing.assert_array_equal(Q, [[1.0, 2.0], [3.0, 4.0]])
    assert not K.any()


def test_output_projection_presets():
    p = heads.two_head_pipeline()
    concat = reference.multi_head_attention(p.X, p.W_Q, p.W_K, p.W_V, p.W_O, 2,
                                            mask=reference.causal_mask(4))["concat"]
    swap = heads.output_projection("swap")
    np.testing.assert_array_equal((concat @ swap)[:, :2], concat[:, 2:])
    np.testing.assert_array_equal(heads.output_projection("identity"), np.eye(4))
    np.testing.assert_array_equal(heads.output_projection("lesson_mixing"), heads.LESSON_MIXING_W_O)
    R1 = heads.output_projection("random", 3, 2, d_model=5, seed=7)
    assert R1.shape == (6, 5)
    np.testing.assert_array_equal(R1, heads.output_projection("random", 3, 2, d_model=5, seed=7))
    # identity and swap: each output channel reads one head; the lesson's mixing and random: several
    for name, mixes in (("identity", False), ("swap", False), ("lesson_mixing", True), ("random", True)):
        W = heads.output_projection(name)
        reads_both = [(W[:2, c] != 0).any() and (W[2:, c] != 0).any() for c in range(4)]
        assert any(reads_both) == mixes, name
    with pytest.raises(ValueError, match="2 heads of width 2"):
        heads.output_projection("lesson_mixing", 3, 2)


def test_nearby_window_is_a_gaussian_window_around_the_query():
    """Scores -(gain/4)(i - t)^2 / sqrt(d_k) up to a per-row constant: weights are a window on t."""
    T, gain = 7, 3.0
    Q, K = heads.nearby_window(T, 2, gain)
    t, i = np.arange(1, T + 1)[:, None], np.arange(1, T + 1)[None, :]
    window = np.exp(-(gain / 4) * (i - t) ** 2 / np.sqrt(2))
    np.testing.assert_allclose(reference.softmax(reference.scaled_scores(Q, K)),
                               window / window.sum(axis=1, keepdims=True), atol=1e-12)
    A = causal_weights(Q, K)
    np.testing.assert_allclose(A[3, 2] / A[3, 3], np.exp(-(gain / 4) / np.sqrt(2)))   # a neighbour: 0.59
    assert heads.PRESETS["nearby"].min_d_k == 2
    with pytest.raises(ValueError, match="d_k >= 2"):
        heads.nearby_window(5, 1)
