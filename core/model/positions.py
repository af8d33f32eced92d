"""How the one transformer tells positions apart (the setting ``TransformerConfig.positional``), each
kind registered under its name: what it adds to the token embeddings of positions ``start ...
start+T-1`` and, for a kind with parameters, its backward pass::

    learned      pos[start:start+T]              a parameter pos (n_ctx, d), trained   (GPT-2, BERT)
    sinusoidal   PE[start:start+T]               the fixed table of core.positional    (the original Transformer)
    none         0                               nothing: only the causal mask can tell positions apart

:data:`POSITIONAL` is the one list of their names (the config checks against it).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from core.model import layers as L


def learned(params: dict, cfg, prefix: str, start: int, T: int, dtype) -> np.ndarray:
    """Rows ``start ... start+T-1`` of the parameter ``{prefix}pos`` (n_ctx, d)."""
    return params[f"{prefix}pos"][start:start + T]


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


@dataclasses.dataclass(frozen=True)
class Positions:
    table: Callable          # (params, cfg, prefix, start, T, dtype) -> (T, d)
    backward: Callable       # (dx (B, T, d), params, prefix, grads) -> None: adds its parameters' gradients
    params: tuple            # its parameters' names, each (n_ctx, d)


POSITIONS = {
    "sinusoidal": Positions(sinusoidal, fixed_backward, ()),
    "learned": Positions(learned, learned_backward, ("pos",)),
    "none": Positions(no_positions, fixed_backward, ()),
}
POSITIONAL = tuple(POSITIONS)
