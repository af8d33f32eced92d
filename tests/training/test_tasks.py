"""Synthetic tasks: labels follow their definitions, classes are balanced, splits are disjoint,
the data is a function of the seed, and 'increasing' negatives are near misses."""
import numpy as np
import pytest

from core import tasks


def _splits(data):
    return [(data.X_train, data.y_train), (data.X_val, data.y_val), (data.X_test, data.y_test)]


def _true_label(task, row, V):
    T = len(row)
    if task == "sum":
        return int(row.sum() > T * (V - 1) / 2)
    if task == "increasing":
        return int(all(row[i] < row[i + 1] for i in range(T - 1)))
    return int(any(row[i] == row[i - 1] for i in range(1, T)))


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_labels_balance_and_disjoint_splits(task):
    data = tasks.make_dataset(task, 600, 201, 100, seed=3)
    spec = tasks.TASKS[task]
    assert (data.seq_len, data.vocab_size) == (spec.seq_len, spec.vocab_size)
    seen = set()
    for (X, y), n in zip(_splits(data), (600, 201, 100)):
        assert X.shape == (n, spec.seq_len) and X.dtype == np.int64 and y.shape == (n,)
        assert X.min() >= 0 and X.max() < spec.vocab_size
        assert (y == 0).sum() == n // 2 and (y == 1).sum() == n - n // 2
        assert all(_true_label(task, row, spec.vocab_size) == label for row, label in zip(X, y))
        keys = {row.tobytes() for row in X}
        assert len(keys) == n, "a sequence appears twice within a split"
        assert not keys & seen, "a sequence appears in two splits"
        seen |= keys
    # not sorted by class: a model must not learn the order of the rows
    assert 0.3 < data.y_train[:100].mean() < 0.7


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_deterministic_for_a_seed(task):
    a = tasks.make_dataset(task, 200, 50, 50, seed=7)
    b = tasks.make_dataset(task, 200, 50, 50, seed=7)
    c = tasks.make_dataset(task, 200, 50, 50, seed=8)
    for (Xa, ya), (Xb, yb) in zip(_splits(a), _splits(b)):
        assert np.array_equal(Xa, Xb) and np.array_equal(ya, yb)
    assert not np.array_equal(a.X_train, c.X_train)


def test_increasing_negatives_are_near_misses():
    data = tasks.make_dataset("increasing", 1000, 0, 0, seed=0)
    X, y = data.X_train, data.y_train
    descents = (np.diff(X, axis=1) < 0).sum(axis=1)
    assert (descents[y == 1] == 0).all()
    assert (descents[y == 0] == 1).all(), "each negative has exactly one pair out of order"
    neg = X[y == 0]
    # undoing one adjacent swap makes every negative strictly increasing: same tokens, one swap
    assert (np.diff(np.sort(neg, axis=1), axis=1) > 0).all()
    k = np.argmax(np.diff(neg, axis=1) < 0, axis=1)
    rows = np.arange(len(neg))
    fixed = neg.copy()
    fixed[rows, k], fixed[rows, k + 1] = neg[rows, k + 1], neg[rows, k]
    assert (np.diff(fixed, axis=1) > 0).all()
    # the swap can sit anywhere, so position carries no shortcut
    assert len(np.unique(k)) == data.seq_len - 1
    # order-blind statistics (the multiset of tokens) match between the classes
    assert abs(X[y == 0].sum(1).mean() - X[y == 1].sum(1).mean()) < 3.0


def test_repeat_classes_differ_only_in_adjacent_equal_pairs():
    data = tasks.make_dataset("repeat", 1000, 0, 0, seed=0)
    X, y = data.X_train, data.y_train
    adjacent = (X[:, 1:] == X[:, :-1]).any(axis=1)
    assert np.array_equal(adjacent, y == 1)
    # negatives still repeat tokens, just never side by side: counting alone cannot solve it
    has_duplicate = np.array([len(set(row)) < len(row) for row in X[y == 0]])
    assert has_duplicate.mean() > 0.9


def test_registry_and_errors():
    for name, spec in tasks.TASKS.items():
        assert spec.name == name and tasks.describe(name) and "\n" not in spec.description
    with pytest.raises(ValueError, match="Unknown task"):
        tasks.make_dataset("parity", 10, 10)
    with pytest.raises(ValueError, match="vocab_size >= seq_len"):
        tasks.make_dataset("increasing", 10, 10, seq_len=12, vocab_size=8)
    with pytest.raises(ValueError, match="different sequences"):
        tasks.make_dataset("increasing", 100, 10, 10, seq_len=4, vocab_size=5)
    with pytest.raises(ValueError, match="n_train"):
        tasks.make_dataset("sum", 1, 0, 0)
    custom = tasks.make_dataset("sum", 20, 4, 4, seq_len=5, vocab_size=3, seed=1)
    assert custom.X_train.shape == (20, 5) and custom.X_train.max() <= 2
