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

For the decoder: the sequence-to-sequence tasks ``reverse`` and ``sort`` (:func:`make_sequence_dataset`)
and a small character corpus for the language model (:func:`make_char_corpus`), further down.
"""
from __future__ import annotations

import dataclasses
import functools
import os
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


# ==============================================================================================
# Sequence-to-sequence tasks for the encoder-decoder, and a character corpus for the language model
# ==============================================================================================
#
# ``reverse`` and ``sort`` map a source string of digits to a target string of digits of the same
# length. Source ids are the digits 0..9; target ids are the digits 0..9 and a start token BOS = 10.
# With teacher forcing the decoder reads the target shifted right by one place, after BOS::
#
#     src     = 3 1 4 1 5 9 2 6
#     tgt_out = 6 2 9 5 1 4 1 3          (what the decoder must produce)
#     tgt_in  = ^ 6 2 9 5 1 4 1          (what it reads: BOS, then tgt_out without its last token)
#
# The attention pattern is one a student can predict: to reverse, output position t reads source
# position T-1-t (cross-attention learns the anti-diagonal); to sort, it must count the digits.

DIGITS = "0123456789"
BOS_SYMBOL = "^"


@dataclasses.dataclass(frozen=True)
class SequenceTask:
    name: str
    description: str
    target: Callable        # src (n, T) int64 -> tgt_out (n, T) int64


SEQUENCE_TASKS: dict[str, SequenceTask] = {
    "reverse": SequenceTask("reverse", "Write the digit string backwards (cross-attention reads the "
                            "source from the end: an anti-diagonal).", lambda src: src[:, ::-1].copy()),
    "sort": SequenceTask("sort", "Write the digits in increasing order (the decoder must count "
                         "how often each digit appears).", lambda src: np.sort(src, axis=1)),
}


@dataclasses.dataclass(frozen=True)
class SequenceDataset:
    """A sequence-to-sequence task, ready for teacher forcing.

    ``src_*`` (n, T) source ids in ``0..src_vocab_size-1``; ``tgt_in_*`` (n, T) the decoder's input
    (BOS, then the target shifted right); ``tgt_out_*`` (n, T) the target ids. All int64.
    """

    task: str
    seq_len: int
    src_vocab_size: int
    vocab_size: int          # target vocabulary: the digits and BOS
    bos_id: int
    src_train: np.ndarray
    tgt_in_train: np.ndarray
    tgt_out_train: np.ndarray
    src_val: np.ndarray
    tgt_in_val: np.ndarray
    tgt_out_val: np.ndarray


def shift_right(tgt_out: np.ndarray, bos_id: int) -> np.ndarray:
    """The decoder's teacher-forcing input: ``[BOS, y_0, ..., y_{T-2}]`` for each row ``(n, T)``."""
    tgt_out = np.asarray(tgt_out)
    return np.concatenate([np.full((tgt_out.shape[0], 1), bos_id, dtype=np.int64),
                           tgt_out[:, :-1].astype(np.int64)], axis=1)


def make_sequence_dataset(task: str, n_train: int = 4000, n_val: int = 500, *, seq_len: int = 8,
                          seed: int = 0) -> SequenceDataset:
    """Train and validation splits of a sequence task (no source string appears twice).

    Parameters
    ----------
    task : "reverse" or "sort"
    n_train, n_val : number of examples in each split (n_train >= 1, n_val >= 0)
    seq_len : length of the source and target strings (at least 2)
    seed : the whole data set is a function of it
    """
    if task not in SEQUENCE_TASKS:
        raise ValueError(f"Unknown sequence task {task!r}: choose one of {', '.join(SEQUENCE_TASKS)}.")
    T, n_train, n_val = int(seq_len), int(n_train), int(n_val)
    if T < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}.")
    if n_train < 1 or n_val < 0:
        raise ValueError(f"Need n_train >= 1 and n_val >= 0, got {n_train} and {n_val}.")
    n = n_train + n_val
    if n > 10 ** T // 2:
        raise ValueError(f"Only {10 ** T} digit strings of length {T} exist; ask for at most "
                         f"{10 ** T // 2} examples in all, got {n}.")
    rng = np.random.default_rng(seed)
    src = np.empty((0, T), dtype=np.int64)
    while len(src) < n:
        draw = np.concatenate([src, rng.integers(0, 10, size=(2 * n, T))])
        _, first = np.unique(draw, axis=0, return_index=True)
        src = draw[np.sort(first)][:n]                             # distinct strings, in drawing order
    tgt_out = SEQUENCE_TASKS[task].target(src).astype(np.int64)
    bos = len(DIGITS)
    tgt_in = shift_right(tgt_out, bos)
    s = slice(0, n_train), slice(n_train, n)
    return SequenceDataset(task, T, len(DIGITS), len(DIGITS) + 1, bos,
                           src[s[0]], tgt_in[s[0]], tgt_out[s[0]], src[s[1]], tgt_in[s[1]], tgt_out[s[1]])


def digits_text(ids) -> str:
    """Target or source ids as text: digits, and ``^`` for BOS."""
    return "".join(DIGITS[i] if i < len(DIGITS) else BOS_SYMBOL for i in np.asarray(ids).tolist())


# ----------------------------------------------------------------------------------------------
# a tiny character-level corpus for the language model (core/training/corpus.txt, written for
# this project: short sentences about attention and transformers)
# ----------------------------------------------------------------------------------------------
CORPUS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    """The whole corpus, one sentence a line."""
    with open(CORPUS_PATH, encoding="utf-8") as f:
        return f.read()


@dataclasses.dataclass(frozen=True)
class CharVocab:
    """Characters and their ids (id ``i`` is ``chars[i]``)."""

    chars: str

    @property
    def size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Text -> int64 ids; a character outside the vocabulary is a ``ValueError`` naming it."""
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = sorted(set(text) - set(index))
        if unknown:
            raise ValueError(f"Unknown character(s) {', '.join(map(repr, unknown))}: the model only knows "
                             f"{self.chars!r}.")
        return np.array([index[c] for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        """Ids -> text."""
        ids = np.asarray(ids).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"Character ids must be in 0..{self.size - 1}.")
        return "".join(self.chars[i] for i in ids.tolist())


@dataclasses.dataclass(frozen=True)
class CharCorpus:
    """The corpus cut into windows for next-character prediction.

    ``X_*`` (n, context) ids and ``Y_*`` (n, context) the same windows one character later, so
    ``Y[:, t]`` is the character after ``X[:, t]``. The validation windows come from the last part
    of the text, which the training windows never see. ``train_ids`` and ``val_ids`` are the two
    parts of the text as ids.
    """

    vocab: CharVocab
    context: int
    train_ids: np.ndarray
    val_ids: np.ndarray
    X_train: np.ndarray
    Y_train: np.ndarray
    X_val: np.ndarray
    Y_val: np.ndarray


def _windows(ids: np.ndarray, T: int):
    starts = np.arange(len(ids) - T)
    X = ids[starts[:, None] + np.arange(T)]                         # (n, T)
    return X, ids[starts[:, None] + np.arange(1, T + 1)]


def make_char_corpus(context: int = 32, val_fraction: float = 0.1) -> CharCorpus:
    """Next-character windows of the corpus: the first ``1 - val_fraction`` of the text for
    training, the rest for validation (every window of ``context + 1`` characters, stride 1)."""
    text = corpus_text()
    T = int(context)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}.")
    cut = int(round(len(text) * (1.0 - val_fraction)))
    if T < 1 or T >= min(cut, len(text) - cut):
        raise ValueError(f"context must be between 1 and {min(cut, len(text) - cut) - 1} characters, "
                         f"got {context}.")
    vocab = CharVocab("".join(sorted(set(text))))
    ids = vocab.encode(text)
    train_ids, val_ids = ids[:cut], ids[cut:]
    X_train, Y_train = _windows(train_ids, T)
    X_val, Y_val = _windows(val_ids, T)
    return CharCorpus(vocab, T, train_ids, val_ids, X_train, Y_train, X_val, Y_val)


def unigram_loss(corpus: CharCorpus) -> float:
    """Cross-entropy (nats per character) of the validation text under the training text's
    character frequencies (add-one smoothed), averaged over the targets ``Y_val`` as a model's
    validation loss is: the baseline for a model that reads no context."""
    counts = np.bincount(corpus.train_ids, minlength=corpus.vocab.size) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[corpus.Y_val].mean())           # the same targets a model's validation loss averages
