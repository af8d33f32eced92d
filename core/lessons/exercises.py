"""The "check yourself" exercises, and the pure functions that mark them.

(The pages' questions live in :mod:`core.lessons.questions`, each on the page where its effect shows.)

Every checker returns its verdict together with an explanation written for the student, so a
page only has to show what comes back. Numbers the answers depend on are computed here (from
:mod:`core.lessons.analysis`, :mod:`core.lessons.heads` and the attention kernels), never typed in by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from core import attention, masks
from core.lessons import analysis, param_counts
from core.lessons import heads
from core.validate import as_float_array


class Check(NamedTuple):
    """A verdict and why."""

    ok: bool
    explanation: str


def score(verdicts) -> tuple[int, int]:
    """``(right, checked)`` over a mapping of question keys to their latest :class:`Check`."""
    return sum(1 for v in verdicts.values() if v.ok), len(verdicts)


class HeadCheck(NamedTuple):
    """A verdict on a hand-designed head, why, and the weights it produced ``(T, T)``."""

    ok: bool
    explanation: str
    weights: np.ndarray


# ---------------------------------------------------------------------------------------------
# a count the parameters page asks for
# ---------------------------------------------------------------------------------------------


def mha_param_count_fixed_head_width(d_model: int, n_heads: int, d_k: int) -> int:
    """Weights of multi-head attention when the head width is fixed instead of ``d_model / H``.

    ``W_Q, W_K, W_V`` are ``(d_model, H d_k)`` and ``W_O`` is ``(H d_k, d_model)``:
    ``4 d_model H d_k``, which is ``4 d_model^2`` only when ``H d_k = d_model``.
    """
    for name, v in (("d_model", d_model), ("n_heads", n_heads), ("d_k", d_k)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v}.")
    return 4 * int(d_model) * int(n_heads) * int(d_k)


# ---------------------------------------------------------------------------------------------
# exercise: a sharper first-token head
# ---------------------------------------------------------------------------------------------

FIRST_TOKEN_T = 6
FIRST_TOKEN_D_K = 2
FIRST_TOKEN_TARGET = 1.1


def first_token_weights(gain: float, T: int = FIRST_TOKEN_T, d_k: int = FIRST_TOKEN_D_K, *,
                        backend: str | None = None) -> np.ndarray:
    """Causal weights ``(T, T)`` of the first-token head with key strength ``gain``, from the kernels."""
    Q, K = heads.first_token(T, d_k, gain)
    _, A = attention.attention(Q, K, np.zeros((T, 1)), masks.causal(T), backend=backend)
    return A


def first_token_gain_needed(target: float = FIRST_TOKEN_TARGET, T: int = FIRST_TOKEN_T,
                            d_k: int = FIRST_TOKEN_D_K) -> float:
    r"""Smallest gain at which row ``T`` of the first-token head blends fewer than ``target`` positions.

    Row ``T`` scores ``m = gain / \sqrt{d_k}`` on key 1 and 0 on the other ``T - 1`` keys, so
    ``p = e^m / (e^m + T - 1)`` on key 1; ``2^{H}`` falls as ``m`` grows, and bisection finds
    where it crosses ``target``.
    """
    if not 1.0 < target < T:
        raise ValueError(f"The target must lie between 1 and {T} effective positions, got {target}.")

    def effective(gain):
        m = gain / math.sqrt(d_k)
        p = 1.0 / (1.0 + (T - 1) * math.exp(-m))
        rest = (1.0 - p) / (T - 1)
        bits = -p * math.log2(p) - ((T - 1) * rest * math.log2(rest) if rest > 0 else 0.0)
        return 2.0 ** bits

    low, high = 0.0, 200.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if effective(mid) >= target else (low, mid)
    return high


def check_first_token_gain(gain, *, backend: str | None = None) -> Check:
    """Exercise: does the first-token head at this key strength blend fewer than 1.1 positions at t = 6?

    ``2^H`` of row 6 (``H`` its entropy in bits) is measured on the weights the kernels compute.
    """
    try:
        gain = float(gain)
    except (TypeError, ValueError):
        return Check(False, f"The gain must be a number, got {gain!r}.")
    if not math.isfinite(gain):
        return Check(False, "The gain must be a finite number.")
    A = first_token_weights(gain, backend=backend)
    t = FIRST_TOKEN_T
    bits = float(analysis.row_entropy_bits(A)[t - 1])
    eff = 2.0 ** bits
    needed = first_token_gain_needed()
    measured = (f"At gain {gain:g}, row {t} puts {A[t - 1, 0]:.3f} on token 1 and spends {bits:.3f} bits: "
                f"2^H = {eff:.3f} effective positions.")
    if eff < FIRST_TOKEN_TARGET:
        return Check(True, measured + f" Below {FIRST_TOKEN_TARGET}: the head is now close to a hold on the "
                     f"first sample. The threshold is a gain of about {needed:.2f}; the lesson's 3 gives "
                     "about 3.5 positions, 6 about 1.4.")
    if gain < 0:
        advice = "A negative gain pushes attention away from token 1; make it positive and larger."
    else:
        advice = ("Increase the gain: the score margin gain/√d_k must beat the pull of the other "
                  f"{t - 1} keys, each of which scores 0.")
    return Check(False, measured + f" That is not below {FIRST_TOKEN_TARGET} yet. " + advice)


# ---------------------------------------------------------------------------------------------
# exercise: one row, two places
# ---------------------------------------------------------------------------------------------

TWO_POSITION_T = 6
TWO_POSITION_D_K = 2
TWO_POSITION_QUERY = 4
TWO_POSITION_TARGETS = (1, 3)
TWO_POSITION_OTHERS = (2, 4)
MIN_TARGET_SHARE = 0.8      # positions 1 and 3 together
MIN_BALANCE = 0.8           # the smaller of the two over the larger
MAX_OTHER_WEIGHT = 0.1      # each of positions 2 and 4


def check_two_position_head(Q, K, *, backend: str | None = None) -> HeadCheck:
    """Exercise: under a causal mask, row 4 should split its attention between positions 1 and 3.

    Passing means: positions 1 and 3 together get at least 0.8 of row 4, in a ratio of at least
    0.8 (roughly even), and positions 2 and 4 at most 0.1 each. ``Q, K`` are ``(T, d_k)``.
    """
    Q = as_float_array(Q, "Q", dtype=np.float64)
    K = as_float_array(K, "K", dtype=np.float64)
    if Q.ndim != 2 or Q.shape != K.shape or Q.shape[0] < TWO_POSITION_QUERY:
        raise ValueError(f"Q and K must both be (T, d_k) with T >= {TWO_POSITION_QUERY}; got shapes "
                         f"{Q.shape} and {K.shape}.")
    T = Q.shape[0]
    _, A = attention.attention(Q, K, np.zeros((T, 1)), masks.causal(T), backend=backend)
    row = A[TWO_POSITION_QUERY - 1]
    a, b = (float(row[p - 1]) for p in TWO_POSITION_TARGETS)
    others = {p: float(row[p - 1]) for p in TWO_POSITION_OTHERS}
    bits = float(analysis.row_entropy_bits(row))
    measured = (f"Row {TWO_POSITION_QUERY}: position 1 gets {a:.3f}, position 3 {b:.3f}, position 2 "
                f"{others[2]:.3f}, position 4 {others[4]:.3f} ({bits:.2f} bits).")
    problems = []
    if a + b < MIN_TARGET_SHARE:
        problems.append(f"positions 1 and 3 together get {a + b:.2f}, less than {MIN_TARGET_SHARE}")
    if max(a, b) > 0 and min(a, b) / max(a, b) < MIN_BALANCE:
        problems.append("the split between 1 and 3 is uneven: give their keys equal scores against query 4")
    for p, w in others.items():
        if w > MAX_OTHER_WEIGHT:
            problems.append(f"position {p} still gets {w:.2f} (at most {MAX_OTHER_WEIGHT})")
    if problems:
        return HeadCheck(False, measured + " Not yet: " + "; ".join(problems) + ".", A)
    return HeadCheck(True, measured + " Done. Equal scores get equal weight under softmax, so a "
                     "marker feature shared by keys 1 and 3 splits the row between them. The price "
                     "is about one bit more entropy than a one-hot head (log2 2 = 1), plus what "
                     "leaks to the unmarked keys.", A)
