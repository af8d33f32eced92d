"""How the one transformer tells positions apart (the setting ``TransformerConfig.positional``), each
kind registered under its name: what it adds to the token embeddings of positions ``start ...
start+T-1`` and, for a kind with parameters, its backward pass::

    learned      pos[start:start+T]              a parameter pos (n_ctx, d), trained   (GPT-2, BERT)
    sinusoidal   PE[start:start+T]               the fixed table of core.positional    (the original Transformer)
    none         0                               nothing: only the causal mask can tell positions apart
    rotary       0                               and inside self-attention each query and key is rotated
                                                 by its position (RoPE: Llama, SmolLM2), below

:data:`POSITIONAL` is the one list of their names (the config checks against it).

Rotary positions (Su et al., RoPE) in the rotate-half layout of ``transformers``' Llama: feature
``c`` of a head (``d_k`` wide) is paired with feature ``c + d_k/2``, and the pair ``i`` of position
``p`` turns by the angle ``p * rope_base ** (-2i / d_k)``::

    rotate(x) = x * cos + rotate_half(x) * sin,     rotate_half([x1, x2]) = [-x2, x1]

with ``cos``, ``sin`` ``(T, d_k)``, each angle written twice (columns ``i`` and ``i + d_k/2``). A
query at position ``p`` and a key at ``s`` then score ``q R(p)^T R(s) k = q R(s - p) k``: only
their distance counts. :func:`rotate_backward` is the transposed rotation, the turn by ``-angle``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from core.model import layers as L
from core.model.compact import wide


def learned(params: dict, cfg, prefix: str, start: int, T: int, dtype) -> np.ndarray:
    """Rows ``start ... start+T-1`` of the parameter ``{prefix}pos`` (n_ctx, d)."""
    return wide(params[f"{prefix}pos"])[start:start + T]


def learned_backward(dx: np.ndarray, params: dict, prefix: str, grads: dict) -> None:
    """Each position's row gets the gradient of every sequence at that position (from position 0)."""
    d_pos = np.zeros_like(params[f"{prefix}pos"])
    d_pos[:dx.shape[1]] = dx.sum(axis=0)
    grads[f"{prefix}pos"] = d_pos


def sinusoidal(params: dict, cfg, prefix: str, start: int, T: int, dtype) -> np.ndarray:
    """Rows ``start ... start+T-1`` of the sinusoidal table (:func:`layers.sinusoid_table`)."""
    return L.sinusoid_table(cfg.n_ctx, cfg.d_model, np.dtype(dtype).str)[start:start + T]


def no_positions(params: dict, cfg, prefix: str, start: int, T: int, dtype) -> np.ndarray:
    """Zeros ``(T, d)``: the model sees its tokens as a set, but for the causal mask."""
    return np.zeros((T, cfg.d_model), dtype=dtype)


def fixed_backward(dx: np.ndarray, params: dict, prefix: str, grads: dict) -> None:
    """A fixed table has no parameters: nothing to train."""


# ----------------------------------------------------------------------------------------------
# rotary positions: the rotation of queries and keys inside self-attention
# ----------------------------------------------------------------------------------------------
def rotary_angles(start: int, T: int, d_k: int, base: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``(T, d_k)`` in ``dtype``, of the angles ``p * base ** (-2i / d_k)`` for
    positions ``p = start ... start+T-1`` and pairs ``i = 0 ... d_k/2 - 1``, each written in columns
    ``i`` and ``i + d_k/2`` (the rotate-half layout). Computed in float64, rounded once to ``dtype``;
    read-only and kept for the next call (every layer of a pass turns by the same angles)."""
    return _rotary_angles(int(start), int(T), int(d_k), float(base), np.dtype(dtype).str)


@functools.lru_cache(maxsize=64)
def _rotary_angles(start: int, T: int, d_k: int, base: float, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = base ** (-np.arange(0, d_k, 2, dtype=np.float64) / d_k)              # (d_k/2,)
    angles = np.arange(start, start + T, dtype=np.float64)[:, None] * inv_freq      # (T, d_k/2)
    angles = np.concatenate([angles, angles], axis=1)                               # (T, d_k)
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    cos.setflags(write=False)
    sin.setflags(write=False)
    return cos, sin


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``[x1, x2] -> [-x2, x1]`` over the last axis: each pair turned by a right angle."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Queries or keys ``x (B, H, T, d_k)`` turned by their positions' angles: ``x cos + rotate_half(x) sin``."""
    return x * cos + rotate_half(x) * sin


def rotate_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The gradient through :func:`rotate`: the transposed rotation, ``dy cos + rotate_half^T(dy sin)``
    with ``rotate_half^T([y1, y2]) = [y2, -y1]`` (a turn by the opposite angle)."""
    ds = dy * sin
    half = ds.shape[-1] // 2
    return dy * cos + np.concatenate([ds[..., half:], -ds[..., :half]], axis=-1)


@dataclasses.dataclass(frozen=True)
class Positions:
    table: Callable          # (params, cfg, prefix, start, T, dtype) -> (T, d)
    backward: Callable       # (dx (B, T, d), params, prefix, grads) -> None: adds its parameters' gradients
    params: tuple            # its parameters' names, each (n_ctx, d)
    rotates: bool = False    # whether self-attention rotates its queries and keys (rotary positions)


POSITIONS = {
    "sinusoidal": Positions(sinusoidal, fixed_backward, ()),
    "learned": Positions(learned, learned_backward, ("pos",)),
    "none": Positions(no_positions, fixed_backward, ()),
    "rotary": Positions(no_positions, fixed_backward, (), rotates=True),
}
POSITIONAL = tuple(POSITIONS)
# the kinds added to the token embeddings: every kind but rotary (which turns queries and keys instead);
# the small models the pages train take these
EMBEDDING_POSITIONAL = tuple(name for name, kind in POSITIONS.items() if not kind.rotates)
