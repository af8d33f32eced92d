"""The next-token sampler: top-k, top-p and temperature as properties (hypothesis), the draw's
distribution, seeding, and the errors a user can trigger."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core.model import sampling
from core.model.sampling import SamplerSettings

logit_rows = st.lists(st.floats(-8.0, 8.0, allow_nan=False, width=64), min_size=2, max_size=12).map(np.array)
seeds = st.integers(0, 2 ** 32 - 1)


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@settings(max_examples=200, deadline=None)
@given(logits=logit_rows, k=st.integers(1, 14), seed=seeds)
def test_top_k_never_picks_outside_the_k_most_likely(logits, k, seed):
    token, probs, allowed = sampling.sample(logits, SamplerSettings(1.0, top_k=k), np.random.default_rng(seed))
    kth_largest = np.sort(logits)[::-1][min(k, logits.size) - 1]
    assert logits[token] >= kth_largest
    assert allowed.sum() == min(k, logits.size)
    assert (logits[allowed].min() >= logits[~allowed]).all()          # the kept ones are the top ones
    assert probs[~allowed].sum() == 0 and probs[token] > 0


@settings(max_examples=200, deadline=None)
@given(logits=logit_rows, p=st.floats(0.01, 1.0), temperature=st.floats(0.3, 3.0), seed=seeds)
def test_top_p_never_picks_outside_the_smallest_set_that_reaches_p(logits, p, temperature, seed):
    token, probs, allowed = sampling.sample(logits, SamplerSettings(temperature, top_p=p),
                                            np.random.default_rng(seed))
    full = _softmax(logits / temperature)
    kept = np.sort(full[allowed])
    # the kept tokens are the most likely ones ...
    assert kept[0] >= full[~allowed].max(initial=0.0)
    # ... their mass reaches p, and without the least likely of them it would not
    assert kept.sum() >= p - sampling.TOP_P_SLACK - 1e-14
    assert kept.size == 1 or kept[1:].sum() < p + 1e-12
    assert allowed[token]
    np.testing.assert_allclose(probs[allowed], full[allowed] / full[allowed].sum(), rtol=1e-12)


@settings(max_examples=100, deadline=None)
@given(logits=logit_rows, k=st.integers(1, 6), p=st.floats(0.05, 1.0), seed=seeds)
def test_top_k_then_top_p_keeps_a_subset_of_top_k(logits, k, p, seed):
    _, _, both = sampling.sample(logits, SamplerSettings(1.0, top_k=k, top_p=p), np.random.default_rng(seed))
    _, _, only_k = sampling.sample(logits, SamplerSettings(1.0, top_k=k), np.random.default_rng(seed))
    assert both.any() and not (both & ~only_k).any()


@settings(max_examples=200, deadline=None)
@given(logits=logit_rows, seed=seeds)
def test_temperature_zero_is_greedy(logits, seed):
    token, probs, allowed = sampling.sample(logits, SamplerSettings(0.0, top_k=3, top_p=0.5),
                                            np.random.default_rng(seed))
    assert token == int(np.argmax(logits))
    assert allowed.sum() == 1 and probs[token] == 1.0


@settings(max_examples=200, deadline=None)
@given(logits=logit_rows, seed=seeds)
def test_temperature_tending_to_zero_tends_to_greedy(logits, seed):
    order = np.sort(logits)
    if order[-1] - order[-2] < 0.05:               # a near tie: the limit is the argmax only for a clear winner
        logits = logits.copy()
        logits[np.argmax(logits)] += 0.05
    best = int(np.argmax(logits))
    mass = [sampling.distribution(logits, SamplerSettings(t))[0][best] for t in (1.0, 0.1, 0.01, 1e-3)]
    assert all(b >= a for a, b in zip(mass, mass[1:]))          # the winner's share grows as tau falls
    token, _, _ = sampling.sample(logits, SamplerSettings(1e-3), np.random.default_rng(seed))
    assert token == best                          # exp(-0.05 / 1e-3) < 1e-21: the others cannot be drawn


def test_draws_follow_the_distribution():
    logits = np.array([2.0, 0.5, 1.0, -1.0, 0.0])
    rng = np.random.default_rng(7)
    n = 20000
    draws = np.array([sampling.sample(logits, SamplerSettings(0.8), rng)[0] for _ in range(n)])
    expected = _softmax(logits / 0.8)
    freq = np.bincount(draws, minlength=5) / n
    # four standard errors of a binomial share: fails by chance about once in 15,000 runs (fixed seed: never)
    np.testing.assert_array_less(np.abs(freq - expected), 4 * np.sqrt(expected * (1 - expected) / n))


def test_same_seed_same_draws_and_no_global_state():
    logits = np.linspace(-1, 1, 9)
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = [sampling.sample(logits, SamplerSettings(1.0, top_p=0.9), np.random.default_rng(5))[0] for _ in range(3)]
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    b = [sampling.sample(logits, SamplerSettings(1.0), rng1)[0] for _ in range(50)]
    c = [sampling.sample(logits, SamplerSettings(1.0), rng2)[0] for _ in range(50)]
    assert a[0] == a[1] == a[2] and b == c
    assert len(set(b)) > 3                        # the draws do vary from one call to the next
    assert (np.random.get_state()[1] == before).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "temperature must be a number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a number >= 0"),
    (dict(top_k=0), "top_k must be a whole number >= 1"),
    (dict(top_k=2.5), "top_k must be a whole number >= 1"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_p=-0.1), r"top_p must be in \(0, 1\]"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplerSettings(**kwargs)


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="finite"):
        sampling.distribution(np.array([0.0, np.nan]), SamplerSettings())
    with pytest.raises(ValueError, match="1-D"):
        sampling.distribution(np.zeros((2, 3)), SamplerSettings())


# ----------------------------------------------------------------------------------------------
# exact boundaries: the nucleus, top-k ties, temperature applied once
# ----------------------------------------------------------------------------------------------
HALF_QUARTER_QUARTER = np.log([0.5, 0.25, 0.25])         # softmax gives 1/2, 1/4, 1/4 to the last bit


def _kept(logits, **kw):
    """The ids the sampler may pick, in order."""
    return np.flatnonzero(sampling.distribution(np.asarray(logits, dtype=np.float64), SamplerSettings(**kw))[1]).tolist()


@pytest.mark.parametrize("p, kept", [
    (0.75, [0, 1]),                       # exactly at a cumulative boundary: the mass 3/4 reaches it
    (0.75 - 1e-9, [0, 1]), (0.75 + 1e-9, [0, 1, 2]),
    (0.5, [0]), (0.5 - 1e-9, [0]), (0.5 + 1e-9, [0, 1]),
    (0.25, [0]), (1e-9, [0]), (1.0, [0, 1, 2]),
])
def test_the_nucleus_is_the_shortest_prefix_whose_mass_reaches_p(p, kept):
    probs, _ = sampling.distribution(HALF_QUARTER_QUARTER, SamplerSettings())
    np.testing.assert_array_equal(probs, [0.5, 0.25, 0.25])              # the boundaries below are exact
    assert _kept(HALF_QUARTER_QUARTER, top_p=p) == kept
    # the same distribution in another order, with a tie: the most likely first, then the lower id
    assert _kept(HALF_QUARTER_QUARTER[[2, 0, 1]], top_p=p) == sorted([[1, 0, 2][i] for i in kept])


@pytest.mark.parametrize("p, n_kept", [(0.25, 1), (0.5, 2), (0.75, 3), (0.5 + 1e-9, 3), (1.0, 4)])
def test_equal_logits_keep_the_lowest_ids_that_reach_p(p, n_kept):
    assert _kept([3.0, 3.0, 3.0, 3.0], top_p=p) == list(range(n_kept))


def test_rounding_in_the_softmax_never_adds_a_token_to_the_nucleus():
    """Logits that are the logs of simple fractions: the softmax and the running sum round, so the
    mass at the boundary can come out a little under p; the nucleus must still stop there."""
    rng = np.random.default_rng(0)
    cases = 0
    for _ in range(300):
        q = rng.integers(1, 20, rng.integers(2, 8)).astype(np.float64)
        q = np.sort(q / q.sum())[::-1]
        for n_kept, p in enumerate(np.cumsum(q)[:-1], start=1):
            if q[n_kept] == q[n_kept - 1]:
                continue                      # a tie across the boundary: which of them stays is the id rule
            assert len(_kept(np.log(q), top_p=float(p))) == n_kept, (q, p)
            cases += 1
    assert cases > 500


@pytest.mark.parametrize("temperature", [1.0, 0.01])
def test_top_p_one_keeps_every_token_even_those_that_round_to_zero(temperature):
    logits = np.array([0.0, -1000.0, -40.0, 1e-20])           # exp(-1000) and exp(-4000) are 0 in float64
    assert _kept(logits, temperature=temperature, top_p=1.0) == [0, 1, 2, 3]
    assert _kept(logits, temperature=temperature) == [0, 1, 2, 3]


def test_top_k_ties_go_to_the_lower_id():
    logits = [1.0, 5.0, 2.0, 5.0, 2.0, 5.0]
    assert _kept(logits, top_k=1) == [1]
    assert _kept(logits, top_k=2) == [1, 3]
    assert _kept(logits, top_k=4) == [1, 2, 3, 5]                     # 2 before 4: the lower id
    assert _kept(logits, top_k=5) == [1, 2, 3, 4, 5]
    assert _kept([0.0] * 5, top_k=3) == [0, 1, 2]


@pytest.mark.parametrize("k", [5, 6, 100])
def test_top_k_of_at_least_the_vocabulary_keeps_every_token(k):
    logits = np.array([0.3, -2.0, 1.5, 0.0, -700.0])
    probs, allowed = sampling.distribution(logits, SamplerSettings(top_k=k))
    assert allowed.all()
    np.testing.assert_array_equal(probs, sampling.distribution(logits, SamplerSettings())[0])


@pytest.mark.parametrize("seed", range(20))
def test_top_k_one_is_greedy(seed):
    logits = np.random.default_rng(seed).normal(size=7)
    logits[seed % 7] = logits.max() + 0.1
    token, probs, allowed = sampling.sample(logits, SamplerSettings(3.0, top_k=1), np.random.default_rng(seed))
    assert token == seed % 7 and probs[token] == 1.0 and allowed.sum() == 1


class _Draws:
    """A stand-in for numpy's Generator that hands out the given uniform draws, in order."""

    def __init__(self, *u):
        self.u = list(u)

    def random(self):
        return self.u.pop(0)


@pytest.mark.parametrize("temperature", [0.5, 2.0, 3.0])
def test_temperature_divides_the_logits_once(temperature):
    """``softmax(z / T)``, not ``z / T^2`` or ``z * T``: logits ``T log(1/2, 1/4, 1/4)`` give back
    exactly 1/2, 1/4, 1/4, and a uniform draw ``u`` picks the token where the cumulative mass
    (1/2, 3/4, 1) first exceeds it."""
    logits = temperature * HALF_QUARTER_QUARTER
    probs, _ = sampling.distribution(logits, SamplerSettings(temperature))
    np.testing.assert_allclose(probs, [0.5, 0.25, 0.25], rtol=1e-15)
    for u, token in ((0.49, 0), (0.51, 1), (0.74, 1), (0.76, 2), (0.0, 0), (0.999, 2)):
        assert sampling.sample(logits, SamplerSettings(temperature), _Draws(u))[0] == token, u


@pytest.mark.parametrize("p, kept", [(0.6, [0]), (2 / 3, [0]), (0.7, [0, 1]), (1.0, [0, 1])])
def test_top_p_reads_the_mass_renormalised_after_top_k(p, kept):
    """``(1/2, 1/4, 1/8, 1/8)`` cut to its top two is ``(2/3, 1/3)``: p up to 2/3 keeps one token
    (over the full distribution 1/2 would not reach 0.6)."""
    assert _kept(np.log([0.5, 0.25, 0.125, 0.125]), top_k=2, top_p=p) == kept
