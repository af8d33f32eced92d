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
    assert kept.sum() >= p - 1e-12
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
