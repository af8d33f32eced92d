"""Synthetic sequence-classification tasks for the tiny encoder.

Each task labels a sequence of token ids ``0..vocab_size-1`` with 0 or 1:

- ``sum``: is the sum of the tokens above the median sum? Order plays no part.
- ``increasing``: is the sequence strictly increasing? Each negative is a near miss, an increasing
  sequence with one adjacent pair swapped, so it holds exactly the same tokens as some positive:
  only their order tells the classes apart, and a model without positions sits at chance.
- ``repeat``: does some token equal the one just before it? Solving it needs a head that looks at
  the previous position.

Every split is balanced (half of each class), the splits share no sequence, and the whole data set
is a function of the seed.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Token ids ``X_*`` (n, T) int64 and labels ``y_*`` (n,) int64 for each split."""

    task: str
    seq_len: int
    vocab_size: int
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


# ----------------------------------------------------------------------------------------------
# candidate generators: rng, count, T, V -> (X (n, T), y (n,)); labels need not be balanced
# ----------------------------------------------------------------------------------------------
def _sum_candidates(rng, n, T, V):
    X = rng.integers(0, V, size=(n, T))
    # the median of the sum of T uniform tokens is T (V - 1) / 2; a sum equal to it counts as "not above"
    y = (2 * X.sum(axis=1) > T * (V - 1)).astype(np.int64)
    return X, y


def _increasing_candidates(rng, n, T, V):
    # positives: T distinct tokens in increasing order
    X = np.sort(np.argsort(rng.random((n, V)), axis=1)[:, :T], axis=1)
    y = np.ones(n, dtype=np.int64)
    if T > 1:
        # near misses: swap one adjacent pair in half of them (same tokens, one descent)
        neg = rng.random(n) < 0.5
        rows = np.flatnonzero(neg)
        k = rng.integers(0, T - 1, size=rows.size)
        X[rows, k], X[rows, k + 1] = X[rows, k + 1], X[rows, k].copy()
        y[rows] = 0
    return X, y


def _repeat_candidates(rng, n, T, V):
    X = rng.integers(0, V, size=(n, T))
    y = (X[:, 1:] == X[:, :-1]).any(axis=1).astype(np.int64)
    return X, y


def _check_increasing(T, V):
    if V < T:
        raise ValueError(f"The 'increasing' task needs vocab_size >= seq_len (a strictly increasing "
                         f"sequence of {T} tokens needs {T} different ids), got vocab_size = {V}.")
    if T < 2:
        raise ValueError("The 'increasing' task needs seq_len >= 2: one token is always increasing.")


def _check_repeat(T, V):
    if T < 2 or V < 2:
        raise ValueError("The 'repeat' task needs seq_len >= 2 and vocab_size >= 2.")


def _check_sum(T, V):
    if V < 2:
        raise ValueError("The 'sum' task needs vocab_size >= 2.")


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    description: str
    candidates: Callable
    check: Callable
    seq_len: int          # suggested defaults for the UI and the command line
    vocab_size: int


TASKS: dict[str, Task] = {
    "sum": Task("sum", "Is the sum of the tokens above the median? (order does not matter)",
                _sum_candidates, _check_sum, 16, 10),
    "increasing": Task("increasing", "Is the sequence strictly increasing? Negatives swap one adjacent "
                       "pair, so only order tells them apart.", _increasing_candidates, _check_increasing, 8, 16),
    "repeat": Task("repeat", "Does any token equal the one before it? (needs a previous-token head)",
                   _repeat_candidates, _check_repeat, 16, 10),
}


def describe(task: str) -> str:
    """One line describing a task, for the UI."""
    return _get(task).description


def _get(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}: choose one of {', '.join(TASKS)}.")
    return TASKS[task]


def make_dataset(task: str, n_train: int = 4000, n_val: int = 1000, n_test: int = 1000, *,
                 seq_len: int | None = None, vocab_size: int | None = None, seed: int = 0) -> Dataset:
    """Balanced, disjoint train/validation/test splits for a task (deterministic for a seed).

    ``seq_len`` and ``vocab_size`` default to the task's suggestion. Each split has ``n // 2``
    sequences labelled 0 and the rest labelled 1; no sequence appears twice anywhere.
    """
    spec = _get(task)
    T = spec.seq_len if seq_len is None else int(seq_len)
    V = spec.vocab_size if vocab_size is None else int(vocab_size)
    if T < 1 or V < 1:
        raise ValueError(f"seq_len and vocab_size must be positive, got {T} and {V}.")
    sizes = [int(n_train), int(n_val), int(n_test)]
    if min(sizes) < 0 or sizes[0] < 2:
        raise ValueError(f"Split sizes must be non-negative and n_train >= 2, got {sizes}.")
    spec.check(T, V)
    need = [sum(n // 2 for n in sizes), sum(n - n // 2 for n in sizes)]   # per class
    rng = np.random.default_rng(seed)
    pools = [np.empty((0, T), dtype=np.int64), np.empty((0, T), dtype=np.int64)]
    seen: set[bytes] = set()
    for _ in range(200):
        X, y = spec.candidates(rng, max(256, 2 * max(need)), T, V)
        X = X.astype(np.int64)
        for label in (0, 1):
            missing = need[label] - len(pools[label])
            if missing <= 0:
                continue
            fresh = []
            for row in X[y == label]:
                key = row.tobytes()
                if key not in seen:
                    seen.add(key)
                    fresh.append(row)
                    if len(fresh) == missing:
                        break
            if fresh:
                pools[label] = np.concatenate([pools[label], np.array(fresh)])
        if all(len(pools[c]) >= need[c] for c in (0, 1)):
            break
    else:
        raise ValueError(f"Could not draw {need[0]} + {need[1]} different sequences for task {task!r} "
                         f"with seq_len = {T} and vocab_size = {V}; use fewer examples or a larger vocabulary.")
    splits, taken = [], [0, 0]
    for n in sizes:
        counts = (n // 2, n - n // 2)
        Xs = np.concatenate([pools[c][taken[c]:taken[c] + counts[c]] for c in (0, 1)])
        ys = np.concatenate([np.full(counts[c], c, dtype=np.int64) for c in (0, 1)])
        taken = [taken[c] + counts[c] for c in (0, 1)]
        order = rng.permutation(n)
        splits += [np.ascontiguousarray(Xs[order]), ys[order]]
    return Dataset(task, T, V, *splits)
