"""order_blindness: without positions the outputs are a permutation; with them they are not."""
import numpy as np
import pytest

from core.lessons import positions


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_without_pe_the_outputs_are_the_same_set_reordered(dtype):
    r = positions.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=False,
                                   backend="cpu", dtype=dtype)
    assert r.permutation.tolist() == [2, 1, 0]
    assert r.is_permutation and r.gap < (1e-12 if dtype == np.float64 else 1e-5)
    np.testing.assert_allclose(r.outputs_b, r.outputs_a[[2, 1, 0]], atol=1e-5)
    # the weights permute on both axes too
    np.testing.assert_allclose(r.weights_b, r.weights_a[:, [2, 1, 0]][:, :, [2, 1, 0]], atol=1e-6)


def test_with_pe_the_outputs_differ():
    r = positions.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=True, backend="cpu")
    assert not r.is_permutation
    assert r.gap > 0.1                       # measured 1.38 with the default seed; far above rounding
    # the middle word keeps its position, the two outer words swap: every row still differs
    assert np.all(np.abs(r.outputs_b - r.outputs_a[r.permutation]).max(axis=1) > 1e-3)


def test_same_order_gives_zero_gap_even_with_pe():
    words = "the cat sat on the mat".split()
    r = positions.order_blindness(words, words, with_pe=True, backend="cpu")
    assert r.gap == 0.0 and r.is_permutation


def test_repeated_words_are_matched_and_longer_sentences_work():
    a = "the cat saw the dog".split()
    b = "the dog saw the cat".split()
    r = positions.order_blindness(a, b, with_pe=False, d_model=12, n_heads=3, backend="cpu")
    assert [a[i] for i in r.permutation] == b
    assert r.is_permutation
    assert not positions.order_blindness(a, b, with_pe=True, d_model=12, n_heads=3, backend="cpu").is_permutation


@pytest.mark.parametrize("a, b, kw, message", [
    ("dog bites man", "man bites cat", {}, "same words"),
    ("dog bites man", "man bites", {}, "same words"),
    ("dog bites man", "man bites dog", {"n_heads": 3}, "cannot be split evenly"),
])
def test_bad_inputs_are_clear_errors(a, b, kw, message):
    with pytest.raises(ValueError, match=message):
        positions.order_blindness(a.split(), b.split(), with_pe=True, backend="cpu", **kw)


def test_empty_sentence_is_refused():
    with pytest.raises(ValueError, match="empty"):
        positions.order_blindness([], [], with_pe=False, backend="cpu")
