"""Hand-set attention heads: queries and keys chosen so a head draws a pattern you can name.

Every preset returns ``(Q, K)``, each of shape ``(T, d_k)``, for a sequence of ``T`` tokens. A
preset writes into as few feature columns as its idea needs; any further columns stay zero, so
widening ``d_k`` only changes the ``1/sqrt(d_k)`` scale (and hence the sharpness), not the idea.

The positional presets write the position onto a circle, with the lesson's 1-based index ``i``:
``code(i) = gain * [cos(2 pi i / T), sin(2 pi i / T)]``. Attention itself knows nothing about
order; these heads are told it by hand (a real model gets it from a positional encoding).

Also here: the lesson's two-head pipeline (``two_head_pipeline``) and output-projection presets
(``output_projection``), used to show what ``W_O`` does to the concatenated heads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from core.recording import recorded
from core.validate import as_float_array

DEFAULT_GAIN = 3.0


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _check_size(T: int, d_k: int, needs: int = 1) -> None:
    """Refuse a sequence length or head width the preset cannot be drawn in."""
    if int(T) != T or T < 1:
        raise ValueError(f"The sequence length T must be a whole number of at least 1, got {T}.")
    if int(d_k) != d_k or d_k < needs:
        raise ValueError(
            f"This head needs at least {needs} feature column(s) per query and key (d_k >= {needs}), "
            f"got d_k = {d_k}."
        )


def _check_gain(gain: float) -> float:
    """The gain must be a finite number (zero is allowed: it gives the uniform head)."""
    gain = float(gain)
    if not np.isfinite(gain):
        raise ValueError(f"The gain must be a finite number, got {gain}.")
    return gain


def circle_code(positions, T: int, gain: float = DEFAULT_GAIN) -> np.ndarray:
    """``gain * [cos(2 pi i / T), sin(2 pi i / T)]`` for each (1-based) position ``i``; ``(n, 2)``."""
    angle = 2.0 * np.pi * np.asarray(positions, dtype=np.float64) / T
    return gain * np.stack([np.cos(angle), np.sin(angle)], axis=-1)


def _zeros(T: int, d_k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((T, d_k)), np.zeros((T, d_k))


# ---------------------------------------------------------------------------------------------
# the presets
# ---------------------------------------------------------------------------------------------

def first_token(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Content head that looks at the first token.

    Only key 1 carries feature 0, with strength ``gain``; every query asks for feature 0:

    ``K[0, 0] = gain``, ``Q[t, 0] = 1``, so ``score(t, i) = gain / sqrt(d_k)`` if ``i = 1`` else 0.

    The margin ``gain / sqrt(d_k)`` sets how sharp the head is: with the lesson's gain 3 and
    ``d_k = 2`` row 6 still spreads about 1.8 bits; a larger gain approaches a hold on sample 1.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=1)
    gain = _check_gain(gain)
    Q, K = _zeros(T, d_k)
    K[0, 0] = gain
    Q[:, 0] = 1.0
    return Q, K


def previous_token(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Positional head that looks one token back (a unit delay).

    Keys sit on a circle, queries one step behind on it (1-based positions):

    ``K_i = gain [cos(2 pi i / T), sin(2 pi i / T)]``,
    ``Q_t = gain [cos(2 pi (t-1) / T), sin(2 pi (t-1) / T)]``,

    so ``Q_t . K_i = gain^2 cos(2 pi (i - t + 1) / T)`` peaks at ``i = t - 1``. Row 1 has no
    previous token; under a causal mask it can only attend to itself.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=2)
    gain = _check_gain(gain)
    Q, K = _zeros(T, d_k)
    positions = np.arange(1, T + 1)
    K[:, :2] = circle_code(positions, T, gain)
    Q[:, :2] = circle_code(positions - 1, T, gain)
    return Q, K


def self_position(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Positional head that looks at itself (the identity filter).

    ``Q_t = K_t = gain [cos(2 pi t / T), sin(2 pi t / T)]``, so ``Q_t . K_i = gain^2 cos(2 pi (i - t) / T)``
    is largest at ``i = t``.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=2)
    gain = _check_gain(gain)
    Q, K = _zeros(T, d_k)
    K[:, :2] = circle_code(np.arange(1, T + 1), T, gain)
    Q[:] = K
    return Q, K


def nearby_window(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Positional head that looks at the tokens near it: a window centred on the query.

    With the positions centred (``u_i = i - (T + 1) / 2``, so the numbers stay small):

    ``Q_t = [u_t, 1]``, ``K_i = (gain / 4) [2 u_i, -u_i^2]``, so
    ``Q_t . K_i = (gain / 4) (2 u_t u_i - u_i^2) = -(gain / 4) (i - t)^2 + (gain / 4) u_t^2``.

    The last term is the same for a whole row, and softmax ignores it: each row is a Gaussian
    window ``exp(-(gain / 4) (i - t)^2 / sqrt(d_k))`` around ``t``. At the lesson's gain 3 and
    ``d_k = 2`` a neighbour gets 0.59 of the query's own share and a token two away 0.12, so
    about three positions count; a larger gain narrows the window towards the identity.
    Under a causal mask only the left half (the token and the ones just before it) is seen.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=2)
    gain = _check_gain(gain)
    Q, K = _zeros(T, d_k)
    u = np.arange(1, T + 1) - (T + 1) / 2.0                  # (T,), centred positions
    Q[:, 0], Q[:, 1] = u, 1.0
    K[:, 0], K[:, 1] = (gain / 4.0) * 2.0 * u, -(gain / 4.0) * u ** 2
    return Q, K


def uniform(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """Degenerate head: all scores zero, so each row averages everything it may see.

    ``Q = K = 0`` gives ``S = 0`` and, under a causal mask, ``A[t, i] = 1/t`` for ``i <= t``: the
    prefix average. ``gain`` is accepted (so every preset has one signature) and ignored.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=1)
    _check_gain(gain)
    return _zeros(T, d_k)


@recorded
def two_positions(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN, *,
                  query: int = 4, targets: tuple[int, int] = (1, 3)) -> tuple[np.ndarray, np.ndarray]:
    """A head whose row ``query`` splits its attention evenly between two chosen positions.

    The keys of the two target positions (1-based) share a marker feature of strength ``gain``;
    the query row asks for that feature, every other row asks for nothing:

    ``K[a, 0] = K[b, 0] = gain``, ``Q[query, 0] = 1``, all else 0,

    so row ``query`` scores ``gain / sqrt(d_k)`` at ``a`` and ``b`` and 0 elsewhere. Softmax gives
    equal scores equal weight, so ``a`` and ``b`` get the same share,
    ``e^m / (2 e^m + n - 2)`` with ``m = gain / sqrt(d_k)`` and ``n`` visible keys; the rest
    share what is left. The price is one extra bit of row entropy over a one-hot head
    (``log2 2``), plus the leak to the unmarked keys.

    A single circle code (as in ``previous_token``) cannot do this when the targets are not
    neighbours: its score is one cosine bump, and the positions between the targets sit on the
    bump too. The marker needs one feature column (``d_k >= 1``); at the lesson's ``d_k = 2`` and
    gain 3, row 4 gives about 0.45 to each of positions 1 and 3 and 0.05 to each of 2 and 4
    (with ``d_k = 1``: 0.48 and 0.02).

    Other rows (which only ask for nothing) average uniformly over what they may see.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k)
    """
    _check_size(T, d_k, needs=1)
    gain = _check_gain(gain)
    a, b = targets
    for name, pos in (("query", query), ("target", a), ("target", b)):
        if int(pos) != pos or not 1 <= pos <= T:
            raise ValueError(f"The {name} position must be between 1 and T = {T}, got {pos}.")
    if a == b:
        raise ValueError(f"The two target positions must differ, got {a} twice.")
    Q, K = _zeros(T, d_k)
    K[a - 1, 0] = gain
    K[b - 1, 0] = gain
    Q[query - 1, 0] = 1.0
    return Q, K


def custom(T: int, d_k: int = 2, gain: float = DEFAULT_GAIN, *,
           Q=None, K=None) -> tuple[np.ndarray, np.ndarray]:
    """Queries and keys typed in by hand (zeros when not given), checked for shape and values.

    The page's data editor starts from zeros; what the student types comes back through here,
    so a wrong shape or a non-number is a clear ``ValueError`` rather than a traceback.
    ``gain`` is accepted for a common signature and ignored.

    Returns
    -------
    Q, K : ndarray, shape (T, d_k), float64
    """
    _check_size(T, d_k, needs=1)
    _check_gain(gain)
    out = []
    for name, M in (("Q", Q), ("K", K)):
        if M is None:
            out.append(np.zeros((T, d_k)))
            continue
        M = as_float_array(M, name, dtype=np.float64)
        if M.shape != (T, d_k):
            raise ValueError(f"{name} must have one row per token and d_k columns, i.e. shape "
                             f"({T}, {d_k}); got shape {M.shape}.")
        out.append(M.copy())
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# registry for the page
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadPreset:
    """A named way to set one head: ``build(T, d_k, gain) -> (Q, K)``."""

    label: str
    build: Callable[..., tuple[np.ndarray, np.ndarray]]
    description: str
    min_d_k: int


PRESETS: dict[str, HeadPreset] = {
    "first_token": HeadPreset("First token", first_token,
                              "Content head: only key 1 carries the feature every query asks for.", 1),
    "previous_token": HeadPreset("Previous token", previous_token,
                                 "Positional head: each query points one step back on a circle code.", 2),
    "self": HeadPreset("Self", self_position,
                       "Positional head: query and key share the circle code, so each token finds itself.", 2),
    "nearby": HeadPreset("Nearby window", nearby_window,
                         "Positional head: a window centred on each query, so nearby tokens count most.", 2),
    "uniform": HeadPreset("Uniform", uniform,
                          "Zero queries and keys: every visible position gets the same weight.", 1),
    "two_positions": HeadPreset("Two positions at once", two_positions,
                                "Row 4 splits its attention between positions 1 and 3 via a shared key marker.", 1),
    "custom": HeadPreset("Custom", custom,
                         "Type queries and keys yourself (starts from zeros).", 1),
}

# The lesson's four heads, in its order (heads 1..4).
LESSON_HEADS = ("first_token", "previous_token", "self", "uniform")

# The presets that are told each token's position by hand: their recipes write the index t into
# the queries and keys (attention itself has no notion of order).
POSITIONAL_PRESETS = ("previous_token", "self", "nearby")


@recorded
def build_head(name: str, T: int, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, K)`` of the preset called ``name`` (a key of ``PRESETS``)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown head preset {name!r}; choose one of {', '.join(PRESETS)}.")
    return PRESETS[name].build(T, d_k, gain)


def lesson_heads(T: int = 6, d_k: int = 2, gain: float = DEFAULT_GAIN) -> tuple[np.ndarray, np.ndarray]:
    """The lesson's four heads stacked: ``Q, K`` of shape ``(4, T, d_k)`` (first, previous, self, uniform)."""
    pairs = [build_head(name, T, d_k, gain) for name in LESSON_HEADS]
    return np.stack([q for q, _ in pairs]), np.stack([k for _, k in pairs])


# ---------------------------------------------------------------------------------------------
# the two-head pipeline and W_O presets
# ---------------------------------------------------------------------------------------------

# The lesson's hand-set mixing: output channel d1 = h1.1 + h2.1, d3 = -h2.1, d2 and d4 copied.
# Rows are concat columns (h1.1, h1.2, h2.1, h2.2); columns are output channels d1..d4.
LESSON_MIXING_W_O = np.array([
    [1.0, 0.0, 0.0, 0.0],
    [0.0, 1.0, 0.0, 0.0],
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 0.0, 0.0, 1.0],
])


@dataclass(frozen=True)
class Pipeline:
    """Inputs of a multi-head attention example, in the packed layout of ``core.attention``.

    ``X (T, d_model)``; ``W_Q, W_K, W_V (d_model, H*d_k)``; ``W_O (H*d_v, d_model)``.
    """

    X: np.ndarray
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    n_heads: int
    head_names: tuple[str, ...]


def two_head_pipeline(W_O: np.ndarray | None = None, gain: float = DEFAULT_GAIN) -> Pipeline:
    """The lesson's two-head example: ``T = 4``, ``d_model = 4``, ``H = 2``, ``d_k = d_v = 2``.

    ``X = I`` (one-hot tokens), so each projection *is* its weight matrix (``Q_h = X W_Q^h = W_Q^h``):

    - head 1: self-attention on the circle code (``Q = K = code(t)``), values ``W_V^1 = I[:, 2:4]``
      (reads features x3, x4);
    - head 2: uniform (``Q = K = 0``), values ``W_V^2 = I[:, 0:2]`` (reads features x1, x2);
    - ``W_O``: the lesson's mixing matrix unless another ``(4, 4)`` matrix is given.

    With a causal mask, ``Concat`` row 3 is ``[0.998, 0, 0.333, 0.333]`` and ``O = Concat W_O``
    row 3 is ``[1.332, 0, -0.333, 0.333]``: channel d1 carries both heads.
    """
    T = d_model = 4
    d_k = 2
    X = np.eye(T)                                            # (T, d_model), one-hot tokens
    Q1, K1 = self_position(T, d_k, gain)                     # (T, d_k)
    Q2, K2 = uniform(T, d_k)                                 # (T, d_k)
    eye = np.eye(d_model)
    W_Q = np.hstack([Q1, Q2])                                # (d_model, H*d_k); X = I
    W_K = np.hstack([K1, K2])
    W_V = np.hstack([eye[:, 2:4], eye[:, 0:2]])              # head 1 reads x3, x4; head 2 x1, x2
    if W_O is None:
        W_O = LESSON_MIXING_W_O.copy()
    else:
        W_O = as_float_array(W_O, "W_O", dtype=np.float64)
        if W_O.shape != (4, 4):
            raise ValueError(f"W_O must be (H*d_v, d_model) = (4, 4) here, got shape {W_O.shape}.")
    return Pipeline(X, W_Q, W_K, W_V, W_O, 2, ("self (circle code)", "uniform"))


def swap_head_blocks(n_heads: int, d_v: int) -> np.ndarray:
    """Permutation ``W_O`` that writes head ``h``'s block to output block ``H-1-h`` (for 2 heads: a swap)."""
    width = n_heads * d_v
    W = np.zeros((width, width))
    for h in range(n_heads):
        src = slice(h * d_v, (h + 1) * d_v)
        dst = slice((n_heads - 1 - h) * d_v, (n_heads - h) * d_v)
        W[src, dst] = np.eye(d_v)
    return W


W_O_PRESETS = {
    "identity": "Identity: each output channel copies one concat column; the heads never meet.",
    "swap": "Swap head blocks: a permutation; still one head per output channel.",
    "lesson_mixing": "The lesson's mixing: d1 = h1.1 + h2.1 and d3 = -h2.1, so channels combine heads.",
    "random": "Random dense matrix (seeded): every output channel mixes every head, as a trained W_O does.",
}


def output_projection(name: str, n_heads: int = 2, d_v: int = 2, d_model: int | None = None,
                      seed: int = 0) -> np.ndarray:
    """An output projection ``W_O`` of shape ``(H*d_v, d_model)`` by preset name.

    ``identity`` and ``swap`` need ``d_model = H*d_v``; ``lesson_mixing`` exists only for the
    lesson's ``H = 2, d_v = 2``; ``random`` draws ``N(0, 1/(H d_v))`` entries so the output has
    the concat's scale.
    """
    width = n_heads * d_v
    d_model = width if d_model is None else d_model
    if name not in W_O_PRESETS:
        raise ValueError(f"Unknown W_O preset {name!r}; choose one of {', '.join(W_O_PRESETS)}.")
    if name == "random":
        rng = np.random.default_rng(seed)
        return rng.normal(0.0, 1.0 / np.sqrt(width), size=(width, d_model))
    if d_model != width:
        raise ValueError(f"The {name!r} W_O is square: it needs d_model = H*d_v = {width}, got {d_model}.")
    if name == "identity":
        return np.eye(width)
    if name == "swap":
        return swap_head_blocks(n_heads, d_v)
    if (n_heads, d_v) != (2, 2):
        raise ValueError("The lesson's mixing W_O is defined for 2 heads of width 2 only "
                         f"(got {n_heads} heads of width {d_v}).")
    return LESSON_MIXING_W_O.copy()
