"""Head scores (core.lessons.head_kinds) on hand-built maps: a perfect map scores one, a uniform
causal map its average, and the induction targets follow the tokens, not the positions."""
import numpy as np
import pytest

from core.lessons import real_model as rm
from core.lessons import head_kinds as hs
from core.lessons import induction as I

N, T = 10, 2 * 10 - 1


def _repeated_once(batch: int, seed: int) -> np.ndarray:
    """``(batch, 2N - 1)``: N distinct random tokens, then the same N again (the last one left out)."""
    first = np.argsort(np.random.default_rng(seed).random((batch, 20)), axis=1)[:, :N]
    return np.concatenate([first, first], axis=1)[:, :-1]


def _uniform_causal(T):
    A = np.tril(np.ones((T, T)))
    return A / A.sum(axis=1, keepdims=True)


def test_a_perfect_induction_map_scores_one_and_a_uniform_map_its_average():
    tokens = _repeated_once(3, seed=1)                                  # (3, T)
    perfect = np.zeros((3, T, T))
    for t in range(T):
        perfect[:, t, t - N + 1 if t >= N else t] = 1.0                 # second half: right after the copy
    assert hs.induction(perfect, tokens) == pytest.approx(1.0)
    uniform = np.broadcast_to(_uniform_causal(T), (3, T, T))
    expected_prev, expected_ind = I.uniform_baselines(tokens)
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


# ----------------------------------------------------------------------------------------------
# exact scores on hand-built maps: one step off is a different head
# ----------------------------------------------------------------------------------------------
def _diagonal(T, offset):
    """A ``(T, T)`` map whose row ``t`` puts all its weight on key ``t + offset`` (on itself where
    that key does not exist)."""
    A = np.zeros((T, T))
    for t in range(T):
        A[t, t + offset if 0 <= t + offset < T else t] = 1.0
    return A


def test_previous_token_is_exactly_the_weight_one_step_back():
    assert hs.previous_token(_diagonal(8, -1)) == 1.0
    assert hs.previous_token(_diagonal(8, -2)) == 0.0           # two back: another head
    assert hs.previous_token(_diagonal(8, 0)) == 0.0            # itself
    # the queries that count are t = 1..T-1: seven weights 1, 1/2, 1/2, 0, 1/4, 3/4, 1/2, mean 1/2
    A = np.eye(8)
    for t, w in zip(range(1, 8), [1, 0.5, 0.5, 0, 0.25, 0.75, 0.5]):
        A[t] = 0.0
        A[t, t - 1], A[t, t] = w, 1 - w
    A[0] = 0.0
    A[0, -1] = 1.0                       # row 0 has no previous key; what it does must not count
    assert hs.previous_token(A) == 0.5
    stacked = np.stack([[_diagonal(8, -1), A, _diagonal(8, 0)]] * 2)   # (2, 3, T, T)
    np.testing.assert_array_equal(hs.previous_token(stacked), [[1.0, 0.5, 0.0]] * 2)
    with pytest.raises(ValueError, match="no previous token"):
        hs.previous_token(np.ones((1, 1)))


def test_next_token_is_exactly_the_weight_one_step_ahead():
    assert hs.next_token(_diagonal(8, 1)) == 1.0
    assert hs.next_token(_diagonal(8, 2)) == 0.0
    assert hs.next_token(_diagonal(8, -1)) == 0.0
    A = _diagonal(8, 1)
    A[-1] = 0.0
    A[-1, 0] = 1.0                       # the last row has no next key; what it does must not count
    A[:4] = 0.0
    A[:4, :4] = 0.25                     # rows 0..3 put 1/4 on keys 0..3: on t + 1 for t = 0, 1, 2
    assert hs.next_token(A) == (0.25 + 0.25 + 0.25 + 0.0 + 1 + 1 + 1) / 7
    with pytest.raises(ValueError, match="no next token"):
        hs.next_token(np.ones((1, 1)))


def test_on_key_is_the_mean_weight_on_that_key():
    A = np.zeros((8, 8))
    A[:4, 0] = 1.0                       # half the queries on the first key
    A[4:, 7] = 0.5                       # the other half split between the last key and the one before
    A[4:, 6] = 0.5
    assert hs.on_key(A, 0) == 0.5
    assert hs.on_key(A, -1) == hs.on_key(A, 7) == 0.25
    assert hs.on_key(A, 1) == 0.0


@pytest.mark.parametrize("T", [2, 4, 8, 16])
def test_broad_is_one_for_uniform_rows_and_zero_for_one_hot_rows(T):
    assert hs.broad(np.full((T, T), 1.0 / T)) == 1.0
    assert hs.broad(_diagonal(T, 0)) == 0.0
    assert hs.broad(_diagonal(T, -1)) == 0.0


def test_broad_counts_bits_over_log2_t():
    """Entropies in bits over ``log2 8 = 3``: a row uniform over 4 of 8 keys holds 2 bits (2/3);
    one over 2 keys, 1 bit (1/3); ``(1/2, 1/4, 1/8, 1/8)``, 1.75 bits. Nats over bits would give
    ``ln 4 / 3``; a different normaliser would move every one of them."""
    A = np.zeros((4, 8))
    A[0, :4] = 0.25
    A[1, 2:4] = 0.5
    A[2, :4] = [0.5, 0.25, 0.125, 0.125]
    A[3] = 1 / 8
    rows = [hs.broad(A[i:i + 1]) for i in range(4)]
    assert rows == [2 / 3, 1 / 3, 1.75 / 3, 1.0]
    assert hs.broad(A) == pytest.approx((2 + 1 + 1.75 + 3) / 12, rel=1e-15)
    with pytest.raises(ValueError, match="at least two keys"):
        hs.broad(np.ones((1, 1)))


N_REP = 5
TOKENS = np.array([7, 2, 9, 4, 1])                   # distinct: each token of the second copy has one earlier copy


@pytest.mark.parametrize("first", [None, 11])        # with a first token (GPT-2's <|endoftext|>) in front
def test_offset_back_reads_exactly_the_key_that_many_positions_earlier(first):
    start = int(first is not None)
    T = start + 2 * N_REP
    second = np.arange(start + N_REP, T)              # the queries of the second copy
    duplicate = _diagonal(T, -N_REP)                  # each query on its earlier copy
    induction = _diagonal(T, -N_REP + 1)              # ... on the token after its earlier copy
    assert hs.offset_back(duplicate, second, N_REP) == 1.0
    assert hs.offset_back(duplicate, second, N_REP - 1) == 0.0
    assert hs.offset_back(induction, second, N_REP - 1) == 1.0
    assert hs.offset_back(induction, second, N_REP) == 0.0
    assert hs.offset_back(induction, second, N_REP - 2) == 0.0


def test_offset_back_refuses_queries_with_nothing_that_far_back():
    A = np.zeros((6, 6))
    A[:, -1] = 1.0                       # every query on the last key: a wrapped index would read 1
    with pytest.raises(ValueError, match="no key that far back"):
        hs.offset_back(A, [0, 1, 2, 3], 2)
    with pytest.raises(ValueError, match="no key that far back"):
        hs.offset_back(A, [4, 6], 2)     # no query 6
    assert hs.offset_back(A, [2, 3], 2) == 0.0


def _repeated(first=None, gap=0):
    """TOKENS, ``gap`` filler tokens, TOKENS again (after an optional first token)."""
    seq = [*([] if first is None else [first]), *TOKENS, *[12] * gap, *TOKENS]
    return np.array([seq])


@pytest.mark.parametrize("first", [None, 11])
def test_the_induction_score_is_one_on_its_targets_and_zero_one_step_off(first):
    tokens = _repeated(first)
    T = tokens.shape[-1]
    # the second copy's queries (the only ones whose token occurred earlier) on the token after the copy
    assert hs.induction(_diagonal(T, -N_REP + 1)[None], tokens) == 1.0
    assert hs.induction(_diagonal(T, -N_REP)[None], tokens) == 0.0           # on the copy itself
    assert hs.induction(_diagonal(T, -N_REP + 2)[None], tokens) == 0.0       # two after it
    assert hs.induction(_diagonal(T, -1)[None], tokens) == 0.0               # a previous-token head
    # half on the target, half on the copy: exactly one half
    half = 0.5 * (_diagonal(T, -N_REP + 1) + _diagonal(T, -N_REP))
    assert hs.induction(half[None], tokens) == 0.5


def test_the_induction_targets_move_with_the_tokens():
    """The second copy one position later: the map that was a perfect induction head now scores 0,
    and the same map shifted by one scores 1."""
    tokens = _repeated(gap=1)
    T = tokens.shape[-1]
    assert hs.induction(_diagonal(T, -N_REP + 1)[None], tokens) == 0.0
    assert hs.induction(_diagonal(T, -N_REP)[None], tokens) == 1.0


def test_every_earlier_copy_is_a_target_and_only_repeated_tokens_count():
    tokens = np.array([[5, 5, 5, 8]])
    assert np.argwhere(hs.induction_targets(tokens)[0]).tolist() == [[1, 1], [2, 1], [2, 2]]
    A = np.zeros((4, 4))
    A[0, 0] = A[3, 0] = 1.0              # queries 0 and 3 (no earlier copy) do not count
    A[1, :2] = [0.75, 0.25]              # query 1's one target, key 1: 1/4
    A[2, :3] = [0.5, 0.25, 0.25]         # query 2's targets, keys 1 and 2: 1/2
    assert hs.induction(A[None], tokens) == (0.25 + 0.5) / 2


def test_the_induction_score_follows_its_formula_on_random_tokens():
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 4, (3, 9))               # many repeats, several copies each
    A = rng.random((2, 3, 9, 9)) * np.tril(np.ones((9, 9)))
    A /= A.sum(-1, keepdims=True)
    total, count = np.zeros(2), 0
    for b in range(3):
        for t in range(9):
            targets = [j for j in range(1, t + 1) if tokens[b, j - 1] == tokens[b, t]]
            if targets:
                total += A[:, b, t, targets].sum(-1)
                count += 1
    np.testing.assert_allclose(hs.induction(A, tokens), total / count, rtol=1e-14)
