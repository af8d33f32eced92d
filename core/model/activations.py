"""The feed-forward network's activations, each a forward and a backward pass registered under its
name (the setting ``TransformerConfig.activation``)::

    act = ACTIVATIONS[cfg.activation]
    y = act.forward(x, tuned)             # tuned: the forward pass runs at GPT-2's sizes (see below)
    dx = act.backward(dy, x, y)           # the gradient at the input x, whose output was y

Adding an activation is a forward, a backward, one line in :data:`ACTIVATIONS` and a test (a
finite-difference check of the backward in ``tests/model/test_activations.py``). The GELUs'
formulas and their compiled loops are in :mod:`core.model.layers`, beside the other sublayers.

``tuned`` is the one choice a forward pass makes at its top (:func:`core.model.transformer.runs_tuned`):
an activation with a tuned twin (:mod:`core.model.tuned.forward`) runs it then, and records which
of its two forms ran, as a page's source expander shows it; the others have no twin and ignore it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from core.model import layers as L
from core.model.tuned import forward as TF


@dataclasses.dataclass(frozen=True)
class Activation:
    forward: Callable       # (x, tuned) -> y
    backward: Callable      # (dy, x, y) -> dx


def relu(x: np.ndarray, tuned: bool = False) -> np.ndarray:
    """``max(x, 0)`` (the original Transformer's), one NumPy pass; no tuned twin."""
    return np.maximum(x, 0.0)


def relu_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ReLU passes the gradient where its output was positive, and nothing elsewhere."""
    return dy * (y > 0)


def gelu_tanh(x: np.ndarray, tuned: bool = False) -> np.ndarray:
    """GELU's tanh form (GPT-2's, :func:`layers.gelu_tanh`), or its tuned twin
    (:func:`core.model.tuned.forward.gelu_tanh`) in a forward pass that runs those."""
    form = TF.gelu_tanh if tuned else L.gelu_tanh
    L.note(form)
    return form(x)


def gelu_tanh_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`layers.gelu_tanh_backward`, from the input ``x``."""
    return L.gelu_tanh_backward(dy, x)


def gelu_erf(x: np.ndarray, tuned: bool = False) -> np.ndarray:
    """The exact GELU ``x Phi(x)`` (BERT's, :func:`layers.gelu_erf`); no tuned twin."""
    return L.gelu_erf(x)


def gelu_erf_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`layers.gelu_erf_backward`: ``dy (Phi(x) + x phi(x))``, from the input ``x``."""
    return L.gelu_erf_backward(dy, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + e^-x)`` from ``e^-|x|``, which never overflows and keeps the small values of a
    negative ``x`` (``1 - 1/(1 + e^x)`` would lose them)."""
    e = np.exp(-np.abs(x))                                    # (0, 1]
    return np.where(x >= 0, x.dtype.type(1.0), e) / (x.dtype.type(1.0) + e)


def silu(x: np.ndarray, tuned: bool = False) -> np.ndarray:
    """``x sigmoid(x)`` (SiLU, or Swish: the gate of Llama's SwiGLU), in NumPy, or its tuned twin
    (:func:`core.model.tuned.forward.silu`) in a forward pass that runs those."""
    if tuned:
        L.note(TF.silu)
        return TF.silu(x)
    return x * sigmoid(x)


def silu_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``dy (s + x s (1 - s))`` with ``s = sigmoid(x)``: the derivative of ``x s(x)``."""
    s = sigmoid(x)
    return dy * s * (1.0 + x * (1.0 - s))


ACTIVATIONS = {
    "relu": Activation(relu, relu_backward),
    "gelu_tanh": Activation(gelu_tanh, gelu_tanh_backward),
    "gelu_erf": Activation(gelu_erf, gelu_erf_backward),
    "silu": Activation(silu, silu_backward),
}
