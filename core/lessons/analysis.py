"""Measurements of attention: selectivity in bits, rank, cost, the checks the lesson pages read,
and what changing the head count does.

Everything here is plain arithmetic on shapes or small arrays; nothing calls a kernel. The
parameter counts live in :mod:`core.lessons.param_counts`; ``analysis.mha_param_count``, the
public API's name for one of them, is imported here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.lessons.param_counts import mha_param_count, mha_param_count_of_width  # noqa: F401 (public name)
from core.recording import recorded
from core.validate import as_float_array, check_heads

# ---------------------------------------------------------------------------------------------
# selectivity, rank, cost
# ---------------------------------------------------------------------------------------------


@recorded
def row_entropy_bits(A) -> np.ndarray:
    """Shannon entropy of each row of an attention matrix, in bits.

    ``H_t = - sum_i A[t, i] log2 A[t, i]``, with ``0 log 0 = 0`` (masked keys cost nothing).
    A one-hot row has 0 bits; a uniform row over ``n`` keys has ``log2 n`` bits.

    Parameters
    ----------
    A : array_like, shape (..., Tq, Tk)
        Row-stochastic attention weights.

    Returns
    -------
    ndarray, shape (..., Tq)
    """
    A = as_float_array(A, "The attention weights")
    if A.ndim < 1:
        raise ValueError("The attention weights must have at least one axis (the keys).")
    safe = np.where(A > 0, A, 1.0)                 # log2(1) = 0 stands in for 0 log 0
    H = -(A * np.log2(safe)).sum(axis=-1)
    return np.maximum(H, 0.0)                      # -0.0 and -1e-17 read as 0 bits


def effective_positions(A) -> np.ndarray:
    """``2 ** H_t``: how many keys a row blends, as if it were uniform over that many; ``(..., Tq)``."""
    return 2.0 ** row_entropy_bits(A)


@recorded
def softmax_gradient_size(A) -> np.ndarray:
    """How much gradient each softmax row passes back to its scores: ``max_i a_i (1 - a_i)``; ``(..., Tq)``.

    The softmax's Jacobian is ``da_i/ds_j = a_i (delta_ij - a_j)``. Its largest entry in size is on
    the diagonal (off it, ``a_i a_j <= a_i (1 - a_i)`` because ``a_j <= 1 - a_i``): at most 1/4,
    when two keys share the weight equally, and 0 for a one-hot row. A saturated softmax passes
    almost nothing back to the queries and keys that made its scores.
    """
    A = as_float_array(A, "The attention weights")
    if A.ndim < 1 or A.shape[-1] == 0:
        raise ValueError("The attention weights must have at least one key.")
    return (A * (1.0 - A)).max(axis=-1)


@recorded
def dot_product_variance(Q, K) -> float:
    """Variance of the raw dot products ``q_t . k_s`` over every pair of a row of ``Q`` and a row of ``K``.

    ``q . k = sum_j q_j k_j`` adds up ``d_k`` products. With independent entries of mean 0 and
    variance 1 each product has variance 1, so ``var(q . k) = d_k``: the scores spread out as
    ``sqrt(d_k)``, which is why they are divided by ``sqrt(d_k)``.
    """
    Q, K = as_float_array(Q, "Q"), as_float_array(K, "K")
    if Q.ndim != 2 or K.ndim != 2 or Q.shape[1] != K.shape[1]:
        raise ValueError(f"Q and K must be matrices with the same width d_k, got shapes {Q.shape} and {K.shape}.")
    return float(np.var(Q @ K.T))                                 # (Tq, Tk) dot products, one variance


@recorded
def score_rank(Q, K, tol: float | None = None):
    """Numerical rank of the score matrix ``Q K^T`` (at most ``d_k``).

    A singular value counts when it exceeds
    ``tol = max(Tq, Tk, d_k) * eps * ||Q||_2 * ||K||_2``: the size of the rounding error in
    forming the product, so a score matrix that is zero up to rounding has rank 0, and the
    answer does not change when ``Q`` or ``K`` is scaled.

    Parameters
    ----------
    Q : array_like, shape (..., Tq, d_k)
    K : array_like, shape (..., Tk, d_k)
    tol : float, optional
        An absolute threshold instead of the one above.

    Returns
    -------
    int, or ndarray of int with shape ``(...)`` for stacked heads.
    """
    Q = as_float_array(Q, "Q", dtype=np.float64)
    K = as_float_array(K, "K", dtype=np.float64)
    if Q.ndim < 2 or K.ndim < 2 or Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q (..., Tq, d_k) and K (..., Tk, d_k) must share d_k; got shapes "
                         f"{Q.shape} and {K.shape}.")
    S = Q @ np.swapaxes(K, -1, -2)                                   # (..., Tq, Tk)
    sv = np.linalg.svd(S, compute_uv=False)                          # (..., min(Tq, Tk))
    if tol is None:
        norm_q = np.linalg.svd(Q, compute_uv=False)[..., 0]         # (...)
        norm_k = np.linalg.svd(K, compute_uv=False)[..., 0]
        size = max(Q.shape[-2], K.shape[-2], Q.shape[-1])
        tol = size * np.finfo(np.float64).eps * norm_q * norm_k
    rank = (sv > np.asarray(tol)[..., None]).sum(axis=-1)
    return int(rank) if np.ndim(rank) == 0 else rank


def score_flops(T: int, d_k: int, n_heads: int = 1) -> int:
    """Floating-point operations to form the scores of ``n_heads`` heads of width ``d_k``.

    Each of the ``T^2`` scores is a length-``d_k`` dot product (``d_k`` multiplies, ``d_k`` adds):
    ``FLOPs = n_heads * 2 * T^2 * d_k``.
    """
    for name, v in (("T", T), ("d_k", d_k), ("n_heads", n_heads)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v}.")
    return int(n_heads) * 2 * int(T) ** 2 * int(d_k)


@dataclass(frozen=True)
class ScoreCost:
    """Score FLOPs of one head of width ``d_model`` against ``H`` heads of width ``d_model / H``."""

    one_wide_head: int
    narrow_heads: int
    n_heads: int
    d_k: int


@recorded
def wide_vs_narrow_score_flops(T: int, d_model: int, n_heads: int) -> ScoreCost:
    """Compare the score cost of one wide head with ``H`` narrow heads.

    ``2 T^2 d_model`` (one head of width ``d_model``) versus
    ``H * 2 T^2 (d_model / H)`` (``H`` heads of width ``d_model / H``): the same number; the
    narrow heads buy ``H`` attention patterns, each of rank at most ``d_model / H``.
    """
    d_k = check_heads(d_model, n_heads)
    return ScoreCost(score_flops(T, d_model, 1), score_flops(T, d_k, n_heads), n_heads, d_k)


# ---------------------------------------------------------------------------------------------
# checks and readings used by the lesson pages
# ---------------------------------------------------------------------------------------------


@recorded
def max_row_sum_error(A) -> float:
    """``max_t |sum_i A[t, i] - 1|``: how far a weight matrix is from row-stochastic (0 for softmax)."""
    A = as_float_array(A, "The attention weights")
    if A.ndim < 1 or A.size == 0:
        raise ValueError("The attention weights must have at least one row.")
    return float(np.max(np.abs(A.sum(axis=-1) - 1.0)))


@recorded
def entropy_ceiling_bits(T: int, causal: bool = True) -> np.ndarray:
    """Largest possible row entropy, ``log2`` of the keys a row may see: ``log2 t`` (causal) or ``log2 T``; ``(T,)``."""
    if int(T) != T or T < 1:
        raise ValueError(f"T must be a positive whole number, got {T}.")
    visible = np.arange(1, int(T) + 1) if causal else np.full(int(T), int(T))
    return np.log2(visible.astype(np.float64))


def heads_per_channel(W_O, n_heads: int, tol: float = 0.0) -> np.ndarray:
    """For each output channel (column of ``W_O``), how many heads write to it; ``(d_model,)`` of int.

    Head ``h`` writes to channel ``j`` when its row block ``W_O[h d_v:(h+1) d_v, j]`` has an entry
    with ``|w| > tol``.
    """
    W_O = as_float_array(W_O, "W_O")
    if W_O.ndim != 2:
        raise ValueError(f"W_O must be a matrix (H*d_v, d_model), got shape {W_O.shape}.")
    d_v = check_heads(W_O.shape[0], n_heads)
    blocks = np.abs(W_O).reshape(n_heads, d_v, W_O.shape[1])       # (H, d_v, d_model)
    return (blocks.max(axis=1) > tol).sum(axis=0)


def channels_mixing_heads(W_O, n_heads: int, tol: float = 0.0) -> list[int]:
    """The output channels (0-based) that read more than one head: ``heads_per_channel(...) > 1``.

    Empty for ``W_O = I`` or a block permutation: each channel then copies one head, and the
    heads never meet.
    """
    return [int(j) for j in np.flatnonzero(heads_per_channel(W_O, n_heads, tol) > 1)]


def qk_circuits(W_Q, W_K, n_heads: int) -> np.ndarray:
    """Each head's QK circuit ``W_Q^h W_K^hT``, ``(H, d_model, d_model)``: the bilinear form that scores
    token ``x`` (as query) against token ``y`` (as key), ``x W_Q^h W_K^hT y^T``. Packed layout:
    head ``h`` uses columns ``h d_k:(h+1) d_k`` of ``W_Q`` and ``W_K``."""
    W_Q, W_K = as_float_array(W_Q, "W_Q"), as_float_array(W_K, "W_K")
    if W_Q.ndim != 2 or W_Q.shape != W_K.shape:
        raise ValueError(f"W_Q and W_K must be matrices of one shape, got {W_Q.shape} and {W_K.shape}.")
    d_k = check_heads(W_Q.shape[1], n_heads)
    Q = W_Q.reshape(W_Q.shape[0], n_heads, d_k).transpose(1, 0, 2)      # (H, d_model, d_k)
    K = W_K.reshape(W_K.shape[0], n_heads, d_k).transpose(1, 0, 2)      # (H, d_model, d_k)
    return Q @ K.transpose(0, 2, 1)


def ov_circuits(W_V, W_O, n_heads: int) -> np.ndarray:
    """Each head's OV circuit ``W_V^h W_O^(h)``, ``(H, d_model, d_out)``: what a token read by head ``h``
    writes into the output. Head ``h`` uses columns ``h d_v:(h+1) d_v`` of ``W_V`` and the same rows of
    ``W_O``."""
    W_V, W_O = as_float_array(W_V, "W_V"), as_float_array(W_O, "W_O")
    if W_V.ndim != 2 or W_O.ndim != 2 or W_V.shape[1] != W_O.shape[0]:
        raise ValueError(f"W_V's columns must be W_O's rows (H·d_v), got shapes {W_V.shape} and {W_O.shape}.")
    d_v = check_heads(W_V.shape[1], n_heads)
    V = W_V.reshape(W_V.shape[0], n_heads, d_v).transpose(1, 0, 2)      # (H, d_model, d_v)
    O = W_O.reshape(n_heads, d_v, W_O.shape[1])                         # (H, d_v, d_out)
    return V @ O


# ---------------------------------------------------------------------------------------------
# scaling the number of heads; how far apart two tokens are
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadLayout:
    """One way to lay out attention: ``H`` heads of width ``d_k`` in a model of width ``d_model`` (usually
    ``H d_k``; wider heads together than the model in exercise 5 read with both kept)."""

    n_heads: int
    d_k: int
    d_model: int
    parameters: int      # 4 d_model H d_k (+ biases): 4 d_model^2 when H d_k = d_model
    score_flops: int     # H * 2 T^2 d_k


GROW_KEEPING = ("d_k", "d_model", "both")


def grow_heads(n_heads_from: int, n_heads_to: int, d_k: int, T: int, *, keep: str = "d_k",
               bias: bool = False) -> tuple[HeadLayout, HeadLayout]:
    """Attention before and after changing the head count from ``H_0`` to ``H_1``.

    Before: ``H_0`` heads of width ``d_k``, so ``d_model = H_0 d_k``. After:

    - ``keep="d_k"`` (the lesson's exercise 5): ``d_model = H_1 d_k`` grows with ``H``, so the
      parameters grow as ``(H_1 / H_0)^2`` and the score FLOPs as ``H_1 / H_0``;
    - ``keep="d_model"``: ``d_k = d_model / H_1`` shrinks; parameters and score FLOPs stay put
      (``H_1`` must divide ``d_model``);
    - ``keep="both"`` (exercise 5 read with ``d_model`` kept): every head stays ``d_k`` wide and
      ``d_model`` stays, so the heads together are ``H_1 d_k`` wide; parameters and score FLOPs grow
      as ``H_1 / H_0``.
    """
    if keep not in GROW_KEEPING:
        raise ValueError(f"Keep one of {', '.join(GROW_KEEPING)} fixed, not {keep!r}.")
    for name, v in (("H before", n_heads_from), ("H after", n_heads_to), ("d_k", d_k)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v}.")

    def layout(H: int, d_model: int, width: int) -> HeadLayout:
        return HeadLayout(H, width, d_model, mha_param_count_of_width(d_model, H, width, bias),
                          score_flops(T, width, H))

    H0, H1, d_k = int(n_heads_from), int(n_heads_to), int(d_k)
    d_model = H0 * d_k
    if keep == "d_k":
        after = layout(H1, H1 * d_k, d_k)
    elif keep == "d_model":
        after = layout(H1, d_model, check_heads(d_model, H1))
    else:
        after = layout(H1, d_model, d_k)
    return layout(H0, d_model, d_k), after


@dataclass(frozen=True)
class PathLengths:
    """How far apart two tokens are, in steps, for attention and for a recurrent network."""

    n_tokens: int
    attention_path: int          # layers between any two tokens: 1
    rnn_path: int                # recurrent steps from the first token to the last: n - 1
    attention_sequential: int    # steps that must run one after another, per layer: 1
    rnn_sequential: int          # n


@recorded
def interaction_paths(n_tokens: int) -> PathLengths:
    """Longest path between two of ``n`` tokens, and sequential steps per layer.

    Self-attention scores every pair in one step, so any two tokens are one layer apart (O(1)) and
    the whole sequence is computed at once. A recurrent network passes information one position per
    step: from the first token to the last is ``n - 1`` steps (O(n)), and the ``n`` steps run in order.
    """
    if int(n_tokens) != n_tokens or n_tokens < 2:
        raise ValueError(f"Take at least two tokens, got {n_tokens}.")
    n = int(n_tokens)
    return PathLengths(n, 1, n - 1, 1, n)
