"""Positional encodings: the sinusoidal dispatcher, similarity helpers, collisions, RoPE, ALiBi."""
import numpy as np
import pytest

from core import backend, positional
from core.lessons import positions, relative_positions
from core.kernels import reference

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not backend.cuda_usable(), reason="no GPU and no CUDA simulator"))]


# --- sinusoidal ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("T, d_model", [(1, 1), (5, 6), (7, 5), (3, 2)])
def test_sinusoidal_matches_the_reference(name, T, d_model):
    PE = positional.sinusoidal(T, d_model, backend=name)
    assert PE.shape == (T, d_model) and PE.dtype == np.float64
    np.testing.assert_allclose(PE, reference.sinusoidal(T, d_model), atol=1e-12)


def test_sinusoidal_float32_and_other_base():
    PE = positional.sinusoidal(40, 16, base=100.0, backend="cpu", dtype=np.float32)
    assert PE.dtype == np.float32
    np.testing.assert_allclose(PE, reference.sinusoidal(40, 16, base=100.0), atol=1e-5)


@pytest.mark.parametrize("args, message", [
    ((0, 8), "T must be"), ((4, 0), "d_model must be"), ((2.5, 8), "T must be"),
    ((4, 8, 1.0), "greater than 1"), ((4, 8, -3.0), "greater than 1"), ((4, 8, np.inf), "greater than 1"),
])
def test_sinusoidal_refuses_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        positional.sinusoidal(*args, backend="cpu")


def test_sinusoidal_refuses_non_float_dtype():
    with pytest.raises(ValueError, match="float32 or float64"):
        positional.sinusoidal(4, 4, backend="cpu", dtype=np.int32)


# --- similarity and the offset property -----------------------------------------------------------

def test_offset_dot_products_depend_only_on_the_offset():
    PE = positional.sinusoidal(64, 16, backend="cpu")
    for k in (1, 3, 10, -5):
        dots = positions.offset_dot_products(PE, k)
        w = 10000.0 ** (-np.arange(0, 16, 2) / 16)
        np.testing.assert_allclose(dots, np.cos(k * w).sum(), atol=1e-12)   # sum_i cos(k w_i)
    # a learned (random) code has no such property: the check can fail
    dots = positions.offset_dot_products(positions.learned(64, 16, seed=1), 3)
    assert np.ptp(dots) > 0.1 * np.abs(dots).max()


def test_offset_positions_are_checked():
    PE = positional.sinusoidal(8, 4, backend="cpu")
    assert positions.offset_dot_products(PE, 2).shape == (6,)
    with pytest.raises(ValueError, match="must lie in"):
        positions.offset_dot_products(PE, 2, positions=[6])


def test_cosine_similarity_is_highest_nearby():
    PE = positional.sinusoidal(50, 128, backend="cpu")
    C = positions.cosine_similarity_matrix(PE)
    np.testing.assert_allclose(np.diag(C), 1.0)
    np.testing.assert_allclose(C, C.T)
    row = positions.similarity_from(PE, 25)
    assert np.argsort(row)[-3:].tolist() in ([24, 26, 25], [26, 24, 25])   # itself, then neighbours
    assert row[26] > row[30] > row[45]


def test_learned_code_is_seeded_and_shaped():
    a, b = positions.learned(10, 8, seed=3), positions.learned(10, 8, seed=3)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (10, 8) and abs(a.std() - 0.02) < 0.01


# --- collisions at small d_model ----------------------------------------------------------------

def test_two_dimensions_alias_far_positions_but_sixty_four_do_not():
    small, wide = positions.collisions_by_width(100, [2, 64], backend="cpu")
    # d = 2: PE_p is the point at angle p on the unit circle; 44 is almost 7 turns (7 * 2 pi = 43.98)
    assert small.j - small.i == 44
    assert small.distance < 0.02 and small.cosine > 0.9998
    # d = 64: the nearest code to any position is its neighbour's, and it is well separated
    assert wide.j - wide.i == 1
    assert wide.distance > 1.0
    assert wide.distance > 50 * small.distance


def test_closest_pair_by_cosine_agrees_on_the_unit_circle():
    PE = positional.sinusoidal(100, 2, backend="cpu")
    by_d, by_c = positions.closest_pair(PE), positions.closest_pair(PE, by="cosine")
    assert (by_d.i, by_d.j) == (by_c.i, by_c.j)               # all codes have norm 1 here


# --- RoPE ---------------------------------------------------------------------------------------

def test_rope_score_depends_only_on_the_offset():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=8), rng.normal(size=8)
    for offset in (0, 1, 5, -3):
        s = relative_positions.rope_offset_scores(q, k, offset, positions=[3, 10, 40, 200])
        np.testing.assert_allclose(s, s[0], rtol=1e-12)
    assert not np.isclose(relative_positions.rope_offset_scores(q, k, 1, [0])[0],
                          relative_positions.rope_offset_scores(q, k, 5, [0])[0])


def test_rope_scores_are_toeplitz_for_repeated_vectors():
    """Same q at every position and same k at every position: S[m, n] depends on n - m only."""
    rng = np.random.default_rng(1)
    T, d_k = 7, 6
    Q = np.tile(rng.normal(size=d_k), (T, 1))
    K = np.tile(rng.normal(size=d_k), (T, 1))
    S = relative_positions.rope_scores(Q, K)
    for diag in range(-T + 1, T):
        np.testing.assert_allclose(np.diag(S, diag), np.diag(S, diag)[0], rtol=1e-12)
    assert np.ptp(S) > 0.1                                   # and it does change with the offset


def test_rope_preserves_norms_and_refuses_odd_widths():
    X = np.random.default_rng(2).normal(size=(2, 5, 4))
    np.testing.assert_allclose(np.linalg.norm(relative_positions.rope_rotate(X), axis=-1),
                               np.linalg.norm(X, axis=-1))
    np.testing.assert_array_equal(relative_positions.rope_rotate(X)[:, 0], X[:, 0])    # position 0: no turn
    with pytest.raises(ValueError, match="even width"):
        relative_positions.rope_rotate(np.ones((3, 5)))


# --- ALiBi --------------------------------------------------------------------------------------

def test_alibi_slopes():
    np.testing.assert_array_equal(relative_positions.alibi_slopes(8), [2.0 ** -h for h in range(1, 9)])
    np.testing.assert_allclose(relative_positions.alibi_slopes(4), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])
    with pytest.raises(ValueError, match="positive whole number"):
        relative_positions.alibi_slopes(0)


def test_alibi_adds_a_linear_distance_penalty_per_head():
    rng = np.random.default_rng(3)
    Q, K = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    S = relative_positions.alibi_scores(Q, K, n_heads=2)              # (2, 5, 5)
    plain = reference.scaled_scores(Q, K)
    m = relative_positions.alibi_slopes(2)
    i, j = np.indices((5, 5))
    for h in range(2):
        np.testing.assert_allclose(S[h] - plain, -m[h] * np.abs(i - j))
    # with Q = K = 0, the causal weights decay geometrically with distance, faster in head 1
    A = reference.softmax(relative_positions.alibi_scores(np.zeros((5, 4)), np.zeros((5, 4)), 2)
                          + reference.causal_mask(5))
    np.testing.assert_allclose(A[0, 4, 3] / A[0, 4, 4], np.exp(-2.0 ** -4))   # e^(-m_1), m_1 = 2^-4
    assert A[0, 4, 0] < A[1, 4, 0]


def test_a_learned_table_stops_at_its_training_length_and_sinusoidal_goes_on():
    res = positions.longer_than_trained(512, 1024, 16, backend="cpu")
    assert res.missing == 512 and "positions 512 to 1023" in res.message
    assert np.isnan(res.learned_rows[512:]).all() and np.isfinite(res.learned_rows[:512]).all()
    np.testing.assert_allclose(res.sinusoidal_rows, reference.sinusoidal(1024, 16), atol=1e-12)
    table = positions.learned(512, 16)
    np.testing.assert_array_equal(positions.lookup_learned(table, 512), table)
    with pytest.raises(ValueError, match="cannot extrapolate"):
        positions.lookup_learned(table, 513)
    fits = positions.longer_than_trained(512, 300, 16, backend="cpu")
    assert fits.missing == 0 and fits.message == ""
