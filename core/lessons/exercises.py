"""The "check yourself" questions and exercises, and the pure functions that mark them.

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
# multiple choice
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: the right option is ``options[answer]``."""

    key: str
    prompt: str
    options: tuple[str, ...]
    answer: int
    explanation: str


QUESTIONS: tuple[Question, ...] = (
    Question(
        "head_width",
        "A model has d_model = 256 and splits it into H = 8 heads in the usual way. How wide is "
        "each head's query and key (d_k)?",
        ("256", "32", "8", "2048"),
        1,
        "Heads share out the model width: d_k = d_model / H = 256 / 8 = 32. Each head sees the "
        "whole input but projects it down to 32 numbers per position.",
    ),
    Question(
        "no_positions",
        "You strip the positional encoding out of an encoder and train it to tell whether a "
        "sequence such as 1, 2, 3, 4, 5 is increasing. What should you expect?",
        ("Nothing changes: attention keeps track of order by itself.",
         "It can get worse: without positions, 1, 2, 3, 4, 5 and 3, 1, 5, 2, 4 reach the layer as "
         "the same bag of vectors.",
         "It gets better, because the embeddings carry less noise.",
         "Training fails outright: the model cannot be run without positions."),
        1,
        "Attention treats its input as a set: reorder the tokens and the outputs are reordered "
        "the same way (the Positional encoding page measures this). A question about order "
        "cannot be answered from a set. The model still trains; it just cannot see the thing the "
        "label depends on.",
    ),
    Question(
        "cross_queries",
        "In the decoder of an encoder-decoder Transformer, where do the queries of the "
        "cross-attention sublayer come from?",
        ("The encoder's output states",
         "The decoder's own stream, i.e. the output of the masked self-attention sublayer before it",
         "The target embeddings alone, before any layer",
         "The positional encoding table"),
        1,
        "The decoder asks and the encoder answers: queries come from the decoder's stream, keys "
        "and values from the encoder's output. That is why the cross-attention map is "
        "rectangular, target length by source length.",
    ),
    Question(
        "more_heads",
        "A colleague says: adding attention heads always makes a model better. Which is a sound "
        "reason to doubt it?",
        ("Every extra head adds 4·d_model² parameters, so the model overfits.",
         "At a fixed d_model each extra head is narrower (d_k = d_model / H), so each head's score "
         "matrix has rank at most d_k; and trained models often carry heads that can be pruned "
         "with little loss.",
         "Extra heads multiply the score FLOPs by H.",
         "All heads share one softmax, so more heads blur each other."),
        1,
        "The parameter count 4·d_model² does not depend on H, and H narrow heads cost the same "
        "score FLOPs as one wide head (see the Parameters page). What H trades is the number of "
        "patterns against how rich each one can be, and in practice many heads end up redundant.",
    ),
    Question(
        "w_o_mixing",
        "Two heads of width 2 feed a 4-wide output through W_O. With W_O = identity, and then "
        "with W_O = the permutation that swaps the two head blocks, does any output channel "
        "depend on more than one head?",
        ("Yes, in both cases.",
         "Only with the swap.",
         "Only with the identity.",
         "No, in neither case: each output channel still copies one concat column."),
        3,
        "A permutation (the identity included) only moves columns around: every output channel "
        "is still one head's column. Channels combine heads only when a column of W_O has "
        "non-zero entries in more than one head block, as in the lesson's mixing matrix; a "
        "learned W_O is dense, which is how later layers get to use all heads at once.",
    ),
    Question(
        "copied_heads",
        "You add heads 5 to 8 as exact copies of heads 1 to 4 (same W_Q, W_K, W_V). What do "
        "heads 5 to 8 output?",
        ("Something new, because they run in parallel.",
         "Exactly what heads 1 to 4 output: same weights, same input, same result.",
         "Zero, because the softmax is shared.",
         "The average of heads 1 to 4."),
        1,
        "A head is a deterministic function of its weights and the input, so a copy repeats its "
        "original. If training started from copies, the copies would also get identical "
        "gradients and stay identical; random initialisation is what lets heads drift apart.",
    ),
    Question(
        "which_architecture",
        "You need to label each review in a collection as positive or negative. Which family "
        "fits best?",
        ("Encoder-only (like BERT)", "Decoder-only (like GPT)", "Encoder-decoder (like T5)"),
        0,
        "The task is to understand a given sequence, not to produce a new one: an encoder reads "
        "the whole review in both directions at once and a small classifier sits on top. "
        "Decoder-only models are built to generate; encoder-decoder models to map one sequence "
        "to another (translation, summaries).",
    ),
)

QUESTIONS_BY_KEY = {q.key: q for q in QUESTIONS}


def _question(key: str) -> Question:
    if key not in QUESTIONS_BY_KEY:
        raise ValueError(f"Unknown question {key!r}; choose one of {', '.join(QUESTIONS_BY_KEY)}.")
    return QUESTIONS_BY_KEY[key]


def check_choice(key: str, chosen) -> Check:
    """Mark a multiple-choice answer, given as the option's text or its index (None: not answered)."""
    q = _question(key)
    if chosen is None:
        return Check(False, "Pick one of the options first.")
    if isinstance(chosen, (int, np.integer)) and not isinstance(chosen, bool):
        if not 0 <= chosen < len(q.options):
            raise ValueError(f"Option {chosen} does not exist; there are {len(q.options)}.")
        index = int(chosen)
    elif chosen in q.options:
        index = q.options.index(chosen)
    else:
        raise ValueError(f"{chosen!r} is not one of this question's options.")
    if index == q.answer:
        return Check(True, "Right. " + q.explanation)
    return Check(False, f"Not quite: the answer is “{q.options[q.answer]}”. " + q.explanation)


# ---------------------------------------------------------------------------------------------
# numeric answers
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


@dataclass(frozen=True)
class NumericQuestion:
    """A question whose answer is a whole number computed by the core."""

    key: str
    prompt: str
    answer: int
    explanation: str


NUMERIC_QUESTIONS: tuple[NumericQuestion, ...] = (
    NumericQuestion(
        "params_384",
        "d_model = 384 with H = 6 heads, weights only (no biases): how many parameters does one "
        "multi-head attention block have?",
        param_counts.mha_param_count(384, 6),
        "W_Q, W_K, W_V and W_O are each 384 × 384, so 4 · 384² = 589,824. The same for H = 1, 2, "
        "4, 8 or 12: only d_k = 384 / H changes.",
    ),
    NumericQuestion(
        "fixed_head_width",
        "d_model = 512, and instead of splitting it you keep every head 64 wide and use H = 16 "
        "heads. How many weights does the attention block have now?",
        mha_param_count_fixed_head_width(512, 16, 64),
        "The projections become 512 × (16 · 64) = 512 × 1024 and W_O 1024 × 512: 4 · 512 · 1024 "
        "= 2,097,152, twice the 1,048,576 of the usual 8 × 64 split. Fixing d_k makes cost grow "
        "with H; that is why scaling recipes grow H together with d_model and keep d_k near 64.",
    ),
)

NUMERIC_BY_KEY = {q.key: q for q in NUMERIC_QUESTIONS}


def check_number(key: str, value) -> Check:
    """Mark a whole-number answer (commas, spaces and underscores in a typed answer are ignored)."""
    if key not in NUMERIC_BY_KEY:
        raise ValueError(f"Unknown question {key!r}; choose one of {', '.join(NUMERIC_BY_KEY)}.")
    q = NUMERIC_BY_KEY[key]
    if isinstance(value, str):
        cleaned = value.strip().replace(",", "").replace("_", "").replace(" ", "")
        if not cleaned:
            return Check(False, "Type a number first.")
        try:
            value = float(cleaned)
        except ValueError:
            return Check(False, f"{value.strip()!r} is not a number.")
    if value is None or not math.isfinite(float(value)):
        return Check(False, "Type a finite number.")
    if float(value) == q.answer:
        return Check(True, "Right. " + q.explanation)
    hint = "too high" if float(value) > q.answer else "too low"
    return Check(False, f"{float(value):,.0f} is {hint}. " + q.explanation)


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
