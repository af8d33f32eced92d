"""What a head does, read off its attention weights: one score per kind of head, each between 0
and 1. The induction page and the real-model page both score their heads here.

Every function takes weights ``(..., T, T)`` (queries by keys: one map, or any stack of maps) and
returns one score per map, ``(...)``, averaged over the queries that count; a caller averages over
its batch axis itself.
"""
from __future__ import annotations

import numpy as np

from core.recording import recorded


def previous_token(A) -> np.ndarray:
    r"""Weight one step back, :math:`\frac{1}{T-1}\sum_{t \ge 1} A_{t, t-1}`."""
    A = np.asarray(A, dtype=np.float64)
    T = A.shape[-1]
    if T < 2:
        raise ValueError("A single position has no previous token.")
    t = np.arange(1, T)
    return A[..., t, t - 1].mean(axis=-1)


def next_token(A) -> np.ndarray:
    r"""Weight one step ahead, :math:`\frac{1}{T-1}\sum_{t < T-1} A_{t, t+1}` (only a model that
    attends both ways can)."""
    A = np.asarray(A, dtype=np.float64)
    T = A.shape[-1]
    if T < 2:
        raise ValueError("A single position has no next token.")
    t = np.arange(T - 1)
    return A[..., t, t + 1].mean(axis=-1)


def on_key(A, key: int) -> np.ndarray:
    """Weight every query gives one key, its mean: ``key`` 0 is a first-token head (an "attention
    sink"; BERT's ``[CLS]``), -1 the last token (BERT's ``[SEP]``)."""
    return np.asarray(A, dtype=np.float64)[..., :, key].mean(axis=-1)


def broad(A) -> np.ndarray:
    r"""Each row's entropy in bits over the most a row of ``T`` keys can have, ``log2 T``, its mean:

    .. math:: \frac{1}{T} \sum_t \frac{-\sum_j A_{tj} \log_2 A_{tj}}{\log_2 T}

    1 for rows uniform over every key, 0 for one-hot rows (``0 log 0 = 0``)."""
    A = np.asarray(A, dtype=np.float64)
    if A.shape[-1] < 2:
        raise ValueError("Over a single key every row is one-hot: breadth needs at least two keys.")
    plogp = np.where(A > 0, A * np.log2(np.where(A > 0, A, 1.0)), 0.0)                 # 0 log 0 = 0
    return (-plogp.sum(-1) / np.log2(A.shape[-1])).mean(-1)


def offset_back(A, queries, back: int) -> np.ndarray:
    """Weight each of ``queries`` gives the key ``back`` positions earlier, its mean: on a sequence
    repeated after ``n`` tokens, ``back = n`` finds duplicate-token heads, ``n - 1`` induction heads."""
    A = np.asarray(A, dtype=np.float64)
    q = np.asarray(queries)
    keys = q - back
    if q.size == 0 or q.min() < 0 or q.max() >= A.shape[-2] or keys.min() < 0 or keys.max() >= A.shape[-1]:
        # a negative index would silently read a key from the far end of the row
        raise ValueError(f"Queries {q.tolist()} looking {back} positions back need keys in 0..{A.shape[-1] - 1}: "
                         f"a query closer than {back} to the start has no key that far back.")
    return A[..., q, keys].mean(axis=-1)


def induction_targets(tokens) -> np.ndarray:
    """``(..., T, T)`` bool: key ``j`` is a target of query ``t`` when ``tokens[j - 1] == tokens[t]``
    and ``j - 1 < t`` (``j``: the position right after an earlier copy of the current token)."""
    tokens = np.asarray(tokens)
    T = tokens.shape[-1]
    same = tokens[..., :, None] == tokens[..., None, :]                  # (..., T, T): tokens[t] == tokens[i]
    earlier = np.tril(np.ones((T, T), dtype=bool), k=-1)                 # i < t
    copies = same & earlier
    targets = np.zeros_like(copies)
    targets[..., :, 1:] = copies[..., :, :-1]                            # shift the copy i to i + 1
    return targets


@recorded
def induction(A, tokens) -> np.ndarray:
    r"""Weight on the induction targets of any token sequence:

    .. math:: s = \frac{1}{|\mathcal{Q}|} \sum_{t \in \mathcal{Q}} \sum_{j:\, x_{j-1} = x_t,\ j-1 < t} A_{t j}

    where :math:`\mathcal{Q}` are the query positions whose token occurred earlier. ``A (..., B, T, T)``
    with ``tokens (B, T)`` -> ``(...)``: the batch is averaged too, over the queries that count.
    """
    A = np.asarray(A, dtype=np.float64)
    targets = induction_targets(tokens)                                  # (B, T, T)
    has = targets.any(axis=-1)                                           # (B, T): queries that count
    if not has.any():
        raise ValueError("No token repeats an earlier one: the induction score is undefined.")
    on_target = (A * targets).sum(axis=-1)                               # (..., B, T)
    return on_target[..., has].mean(axis=-1)
