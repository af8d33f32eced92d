"""The tiny inputs every kernel module's ``warm_up`` runs its drivers on, defined once.

Numba compiles a kernel once per type signature, not per size: one call on the smallest arrays of
each argument's rank and dtype compiles (or loads from the disk cache) the machine code every later
call runs.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TinyInputs(NamedTuple):
    X4: np.ndarray      # (1, 1, 2, 2): Q, K, V, scores, weights, head outputs
    X3: np.ndarray      # (1, 2, 2): activations (B, T, d_model)
    W: np.ndarray       # (2, 2): a projection
    b: np.ndarray       # (2,): its bias
    mask: np.ndarray    # (1, 1, 1, 1): the kernels' "no mask", one 0 broadcast everywhere


def tiny_inputs(dtype) -> TinyInputs:
    """The smallest arrays of each kind the kernels take, in ``dtype``."""
    dtype = np.dtype(dtype)
    return TinyInputs(np.ones((1, 1, 2, 2), dtype), np.ones((1, 2, 2), dtype), np.ones((2, 2), dtype),
                      np.zeros(2, dtype), np.zeros((1, 1, 1, 1), dtype))
