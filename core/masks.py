"""Additive attention masks: 0 where a query may look, -inf where it may not.

They are added to the scaled scores before the softmax, so a masked weight is exactly 0.
"""
from __future__ import annotations

import numpy as np


def causal(T: int, dtype=np.float64, *, start: int = 0) -> np.ndarray:
    r"""The causal mask ``(T, start + T)``: :math:`M_{ij} = 0` if :math:`j \le start + i`, else :math:`-\infty`.

    Query ``i`` may look at itself and the past, never the future. ``start`` is the number of
    positions already in a KV cache: the ``T`` new queries sit at positions ``start ... start+T-1``
    and see every cached key (``start=0``, the default, is the square mask of a whole sequence).
    The one definition of causality: the readable model builds its mask here, and the compiled
    training step's attention (:mod:`core.model.tuned.attention`) is tested to agree with it.
    """
    T = _positive_length(T, "T")
    if int(start) != start or start < 0:
        raise ValueError(f"start must be a whole number of cached positions, 0 or more, got {start}.")
    return np.triu(np.full((T, int(start) + T), -np.inf, dtype=dtype), k=int(start) + 1)


def padding(lengths, T: int, dtype=np.float64) -> np.ndarray:
    r"""The padding mask ``(B, 1, T)``: key ``j`` of sequence ``b`` is allowed when ``j < lengths[b]``.

    The middle axis broadcasts over queries (and, in multi-head attention, over heads).
    """
    T = _positive_length(T, "T")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.dtype.kind not in "iu":
        raise ValueError(f"lengths must be a non-empty list of whole numbers, got {lengths!r}.")
    if (lengths < 0).any() or (lengths > T).any():
        raise ValueError(f"Every length must be between 0 and T = {T}; got {lengths.tolist()}.")
    allowed = np.arange(T)[None, None, :] < lengths[:, None, None]   # (B, 1, T)
    return np.where(allowed, 0.0, -np.inf).astype(dtype)


def combine(*masks) -> np.ndarray:
    """Several additive masks at once: a key is allowed only where every mask allows it."""
    return sum(np.asarray(m) for m in masks if m is not None)


def _positive_length(T, name: str) -> int:
    if int(T) != T or T < 1:
        raise ValueError(f"{name} must be a whole number of positions of at least 1, got {T}.")
    return int(T)
