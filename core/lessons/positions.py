"""Where a token sits: positional encodings and what they do to attention scores (the lessons
behind the positional page; the public ``sinusoidal`` is in ``core.positional``).

Attention is order-blind: permute the tokens and the outputs permute with them. A model learns
order only from a signal added to (or applied inside) attention:

- ``core.positional.sinusoidal``: the original Transformer's fixed code;
- ``learned``: one trainable vector per position (here a seeded random stand-in);
- rotary embeddings (RoPE) and ALiBi, which act on the scores instead: :mod:`core.lessons.relative_positions`.

Helpers measure the codes: cosine similarity between positions, the offset property of the
sinusoids, and how close two distinct positions come when ``d_model`` is small.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from core.attention import multi_head_attention
from core.positional import _check_length_width, sinusoidal
from core.validate import as_float_array, require_ndim


def frequencies(d_model: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal code's frequencies ``w_i = 1 / base^(2i / d_model)``, one per pair of columns
    ``(2i, 2i + 1)``, in radians per position: from ``w_0 = 1`` down to about ``1 / base``."""
    d_model = _check_length_width(1, d_model)[1]
    base = float(base)
    if not np.isfinite(base) or base <= 1.0:
        raise ValueError(f"The base must be a finite number above 1, got {base}.")
    return base ** (-np.arange(0, d_model, 2) / d_model)


def learned(T: int, d_model: int, seed: int = 0, std: float = 0.02, dtype=np.float64) -> np.ndarray:
    """Stand-in for learned positional embeddings: one random vector per position, ``(T, d_model)``.

    ``P[p] ~ N(0, std^2 I)``, the initialisation BERT uses (``std = 0.02``). Before training the
    vectors are unrelated: nearby positions are no more alike than distant ones, and a position
    beyond ``T`` has no vector at all. Training is what gives them structure.
    """
    T, d_model = _check_length_width(T, d_model)
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, std, size=(T, d_model)).astype(dtype)


def lookup_learned(table, T: int) -> np.ndarray:
    """Rows ``0..T-1`` of a learned position table, ``(T, d_model)``.

    A learned table has exactly as many rows as the positions it was trained on; asking for more
    is a ``ValueError`` that names the missing positions (what an embedding lookup does with an
    index past the end, said in the user's terms).
    """
    table = _as_code(table)
    T = _check_length_width(T, table.shape[1])[0]
    if T > table.shape[0]:
        raise ValueError(
            f"A learned table trained at {table.shape[0]} positions has rows for positions 0 to "
            f"{table.shape[0] - 1} only: positions {table.shape[0]} to {T - 1} ({T - table.shape[0]} of the "
            f"{T} asked for) have no vector. It cannot extrapolate beyond its training length.")
    return table[:T]


@dataclass(frozen=True)
class LongerThanTrained:
    """A learned table and the sinusoidal code, both asked for more positions than training saw."""

    trained: int
    asked: int
    learned_rows: np.ndarray     # (asked, d_model): the table's rows, NaN where no row exists
    sinusoidal_rows: np.ndarray  # (asked, d_model): every row, from the formula
    message: str                 # what the learned lookup says ("" when the table is long enough)

    @property
    def missing(self) -> int:
        """Positions with no learned vector."""
        return int(np.isnan(self.learned_rows).all(axis=1).sum())


def longer_than_trained(trained: int, asked: int, d_model: int, base: float = 10000.0, *, seed: int = 0,
                        backend: str | None = None, dtype=np.float64) -> LongerThanTrained:
    """Ask a learned table of ``trained`` rows and the sinusoidal formula for ``asked`` positions.

    The learned lookup fails past row ``trained - 1`` (those rows come back as NaN, with the
    lookup's message); the sinusoidal code is a formula of ``p`` and gives every row.
    """
    trained, d_model = _check_length_width(trained, d_model)
    asked = _check_length_width(asked, d_model)[0]
    table = learned(trained, d_model, seed=seed, dtype=dtype)
    rows = np.full((asked, d_model), np.nan, dtype=dtype)
    message = ""
    try:
        rows[:] = lookup_learned(table, asked)
    except ValueError as err:
        message = str(err)
        rows[:trained] = table
    return LongerThanTrained(trained, asked, rows, sinusoidal(asked, d_model, base, backend=backend, dtype=dtype),
                             message)


# ---------------------------------------------------------------------------------------------
# measuring a code
# ---------------------------------------------------------------------------------------------


def _as_code(PE) -> np.ndarray:
    PE = as_float_array(PE, "The positional encoding", dtype=np.float64)
    require_ndim(PE, "The positional encoding", 2, 2)
    return PE


def cosine_similarity_matrix(PE) -> np.ndarray:
    """Cosine similarity between every pair of positions, ``(T, T)``.

    ``C[p, q] = PE_p . PE_q / (||PE_p|| ||PE_q||)``; a zero vector has similarity 0 with all.
    """
    PE = _as_code(PE)
    norms = np.linalg.norm(PE, axis=1)                      # (T,)
    unit = np.divide(PE, norms[:, None], out=np.zeros_like(PE), where=norms[:, None] > 0)
    return np.clip(unit @ unit.T, -1.0, 1.0)                 # (T, T)


def similarity_from(PE, position: int) -> np.ndarray:
    """Cosine similarity of every position to one ``position`` (0-based), ``(T,)``: one row of the matrix."""
    PE = _as_code(PE)
    if int(position) != position or not 0 <= position < PE.shape[0]:
        raise ValueError(f"The position must be between 0 and {PE.shape[0] - 1}, got {position}.")
    return cosine_similarity_matrix(PE)[int(position)]


def offset_dot_products(PE, offset: int, positions=None) -> np.ndarray:
    """Dot products ``PE_p . PE_{p+k}`` for several ``p`` at one offset ``k``.

    For the sinusoidal code every pair of columns contributes
    ``sin(p w) sin((p+k) w) + cos(p w) cos((p+k) w) = cos(k w)``, so
    ``PE_p . PE_{p+k} = sum_i cos(k w_i)`` does not depend on ``p`` (exactly, for even
    ``d_model``): the returned values are all equal. For a learned code they are not.

    Parameters
    ----------
    PE : array_like, shape (T, d_model)
    offset : int
        ``k``; may be negative.
    positions : sequence of int, optional
        The ``p`` to use (0-based); default every ``p`` with ``0 <= p, p + k < T``.

    Returns
    -------
    ndarray, shape (len(positions),)
    """
    PE = _as_code(PE)
    T = PE.shape[0]
    k = int(offset)
    if positions is None:
        positions = np.arange(max(0, -k), min(T, T - k))
    positions = np.asarray(positions, dtype=int)
    if positions.size == 0:
        raise ValueError(f"No position p has both p and p + {k} inside 0..{T - 1}.")
    if positions.min() < 0 or positions.max() >= T or (positions + k).min() < 0 or (positions + k).max() >= T:
        raise ValueError(f"Every p and p + {k} must lie in 0..{T - 1}.")
    return np.einsum("pd,pd->p", PE[positions], PE[positions + k])


@dataclass(frozen=True)
class ClosestPair:
    """The two distinct positions whose codes are most alike, and how alike."""

    i: int
    j: int
    distance: float          # ||PE_i - PE_j||
    cosine: float            # cosine similarity of PE_i and PE_j
    typical_norm: float      # mean ||PE_p||, to read ``distance`` against


def closest_pair(PE, by: str = "distance") -> ClosestPair:
    """Find the most easily confused pair of distinct positions in a code.

    ``by="distance"``: the pair minimising ``||PE_i - PE_j||``; ``by="cosine"``: the pair
    maximising the cosine similarity. With a small ``d_model`` the sinusoidal clocks come back
    near where they started, and positions far apart collide (for ``d_model = 2``, ``PE_p`` is
    the point at angle ``p`` radians on the unit circle, so ``p`` and ``p + 44`` are ``0.018``
    apart, since ``44 ~ 7 * 2 pi``).
    """
    PE = _as_code(PE)
    T = PE.shape[0]
    if T < 2:
        raise ValueError("Need at least two positions to find a closest pair.")
    if by not in ("distance", "cosine"):
        raise ValueError(f"by must be 'distance' or 'cosine', got {by!r}.")
    sq = (PE ** 2).sum(axis=1)                                        # (T,)
    D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * PE @ PE.T, 0.0))   # (T, T)
    C = cosine_similarity_matrix(PE)                                   # (T, T)
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)                  # distinct pairs, once
    if by == "distance":
        flat = np.where(upper, D, np.inf).argmin()
    else:
        flat = np.where(upper, C, -np.inf).argmax()
    i, j = np.unravel_index(flat, (T, T))
    return ClosestPair(int(i), int(j), float(D[i, j]), float(C[i, j]), float(np.sqrt(sq).mean()))


def collisions_by_width(T: int, d_models, base: float = 10000.0, *,
                        backend: str | None = None) -> list[ClosestPair]:
    """The closest pair of distinct sinusoidal positions among ``0..T-1``, for each width in ``d_models``.

    Read ``j - i``: when it is 1 the nearest code to any position is a neighbour's (no aliasing);
    when it is large, two far-apart positions look alike.
    """
    return [closest_pair(sinusoidal(T, int(d), base, backend=backend), by="distance")
            for d in d_models]


@dataclass(frozen=True)
class Collision:
    """The closest call of a table of closest pairs: two distant positions, and neighbours to compare."""

    d_model: int
    pair: ClosestPair
    neighbour_distance: float    # ||PE_p - PE_(p+1)||, the same for every p in a sinusoidal code

    @property
    def times_closer(self) -> float:
        """How many times closer the distant pair's codes are than two neighbours' codes."""
        return self.neighbour_distance / self.pair.distance if self.pair.distance > 0 else float("inf")


def worst_collision(pairs, d_models, base: float = 10000.0) -> Collision | None:
    """Of the closest pairs of :func:`collisions_by_width` that are not neighbours (``j - i > 1``), the
    one whose codes are nearest compared with two neighbours' codes; None when every closest pair is
    a pair of neighbours (no two distant positions collide).

    In the sinusoidal code ``||PE_p - PE_(p+k)||^2 = sum_i 2 (1 - cos(k w_i))`` depends on ``k`` only,
    so one neighbour distance serves every ``p``.
    """
    found = None
    for d, pair in zip(d_models, pairs):
        if pair.j - pair.i <= 1:
            continue
        two = sinusoidal(2, int(d), base)                                 # positions 0 and 1
        candidate = Collision(int(d), pair, float(np.linalg.norm(two[1] - two[0])))
        if found is None or candidate.times_closer > found.times_closer:
            found = candidate
    return found


def self_and_other_scores(P) -> tuple[float, float]:
    """Position-only scores ``S = P P^T / sqrt(d)``: the mean of the diagonal (each position with
    itself, ``|P_p|^2 / sqrt(d)``) and the mean size ``|S_pq|`` of the scores between two different
    positions."""
    P = _as_code(P)
    T = P.shape[0]
    if T < 2:
        raise ValueError("Need at least two positions to compare a position with another.")
    S = P @ P.T / np.sqrt(P.shape[1])                                     # (T, T)
    off = ~np.eye(T, dtype=bool)
    return float(np.diag(S).mean()), float(np.abs(S[off]).mean())


def shuffled(words, seed: int, *, unlike=None) -> list[str]:
    """``words`` in a seeded random order other than their own, and other than ``unlike`` (the order
    shown now) when a third order exists; fewer than two different words have one order only."""
    words = [str(w) for w in words]
    orders = math.factorial(len(words))
    for count in Counter(words).values():
        orders //= math.factorial(count)                  # distinct orders of the multiset
    if orders < 2:
        return words
    avoid = [words] + ([[str(w) for w in unlike]] if unlike is not None and orders > 2 else [])
    rng = np.random.default_rng(seed)
    for _ in range(64):                                   # each draw is avoided with chance at most 2/3
        out = [words[i] for i in rng.permutation(len(words))]
        if out not in avoid:
            return out
    return words[1:] + words[:1]                          # (2/3)^64: never in practice; still another order


# ---------------------------------------------------------------------------------------------
# order blindness: one attention layer, two word orders
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderBlindness:
    """One attention layer run on two orderings of the same words (see :func:`order_blindness`).

    ``permutation[i]`` is the position in sentence A of the word at position ``i`` of sentence B,
    so ``outputs_a[permutation]`` is A's outputs put into B's order. ``gap`` is
    ``max |outputs_b - outputs_a[permutation]|``: rounding-level when attention is blind to the
    order, clearly non-zero when position is encoded.
    """

    words_a: tuple[str, ...]
    words_b: tuple[str, ...]
    permutation: np.ndarray     # (T,)
    inputs_a: np.ndarray        # (T, d_model), embeddings (+ PE)
    inputs_b: np.ndarray
    outputs_a: np.ndarray       # (T, d_model)
    outputs_b: np.ndarray
    weights_a: np.ndarray       # (H, T, T)
    weights_b: np.ndarray
    gap: float
    tolerance: float
    with_pe: bool

    @property
    def is_permutation(self) -> bool:
        """True when B's outputs are A's outputs reordered (up to rounding)."""
        return self.gap <= self.tolerance


def _word_permutation(words_a, words_b) -> np.ndarray:
    """``perm`` with ``words_b[i] == words_a[perm[i]]`` (repeated words matched left to right)."""
    if sorted(words_a) != sorted(words_b):
        raise ValueError("The second sentence must use exactly the same words as the first, in another "
                         f"order; got {' '.join(words_a)!r} and {' '.join(words_b)!r}.")
    unused: dict[str, list[int]] = {}
    for i, w in enumerate(words_a):
        unused.setdefault(w, []).append(i)
    return np.array([unused[w].pop(0) for w in words_b], dtype=int)


def order_blindness(words_a, words_b, *, with_pe: bool, d_model: int = 8, n_heads: int = 2,
                    seed: int = 0, base: float = 10000.0, backend: str | None = None,
                    dtype=np.float64) -> OrderBlindness:
    r"""Run one multi-head attention layer on two orderings of the same words.

    Each word gets a fixed random embedding (seeded; the same word always gets the same vector);
    the projections ``W_Q, W_K, W_V, W_O`` are fixed random ``(d, d)`` matrices. Then

    .. math:: O = \mathrm{MHA}(E + P), \qquad P = PE \text{ (sinusoidal) or } 0.

    Without positions, attention is permutation-equivariant: ``O_B = \Pi O_A`` for the
    permutation ``\Pi`` that reorders the words, so "dog bites man" and "man bites dog" give the
    same set of output vectors. With positions added, the same word at another position is a
    different input and the outputs change.

    Parameters
    ----------
    words_a, words_b : sequences of str; ``words_b`` must be a reordering of ``words_a``.
    with_pe : add the sinusoidal code (computed by the chosen backend) to the embeddings.
    d_model, n_heads : layer size; ``n_heads`` must divide ``d_model``.

    Returns
    -------
    OrderBlindness
    """

    words_a, words_b = tuple(str(w) for w in words_a), tuple(str(w) for w in words_b)
    if not words_a:
        raise ValueError("The sentence is empty: give at least one word.")
    perm = _word_permutation(words_a, words_b)
    T, d_model = _check_length_width(len(words_a), d_model)
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    vocab = sorted(set(words_a))
    table = dict(zip(vocab, rng.normal(0.0, 1.0, size=(len(vocab), d_model))))   # word -> (d,)
    W_Q, W_K, W_V, W_O = (rng.normal(0.0, 1.0 / np.sqrt(d_model), size=(d_model, d_model)).astype(dtype)
                          for _ in range(4))
    P = sinusoidal(T, d_model, base, backend=backend, dtype=dtype) if with_pe else np.zeros((T, d_model), dtype)
    X_a = np.stack([table[w] for w in words_a]).astype(dtype) + P          # (T, d)
    X_b = np.stack([table[w] for w in words_b]).astype(dtype) + P          # (T, d)
    res_a = multi_head_attention(X_a, W_Q, W_K, W_V, W_O, n_heads, backend=backend)
    res_b = multi_head_attention(X_b, W_Q, W_K, W_V, W_O, n_heads, backend=backend)
    gap = float(np.max(np.abs(res_b.output - res_a.output[perm])))
    scale = max(1.0, float(np.max(np.abs(res_a.output))))
    tolerance = 1e3 * float(np.finfo(dtype).eps) * scale
    return OrderBlindness(words_a, words_b, perm, X_a, X_b, res_a.output, res_b.output,
                          res_a.weights, res_b.weights, gap, tolerance, bool(with_pe))
