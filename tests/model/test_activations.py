"""Every registered activation: its backward pass against central differences of its forward pass,
its forward against its formula; and the one that has a tuned twin records which form ran."""
import math

import numpy as np
import pytest

from core.model import activations as A
from core.model import layers as L
from core.recording import recording

# away from 0, where ReLU has no derivative; out to where GELU's tails flatten
X = np.concatenate([np.linspace(-6.0, -0.05, 40), np.linspace(0.05, 6.0, 40)])


@pytest.mark.parametrize("name", list(A.ACTIVATIONS))
def test_the_backward_pass_is_the_derivative_of_the_forward(name):
    act = A.ACTIVATIONS[name]
    y = act.forward(X)
    dy = np.random.default_rng(0).normal(size=X.shape)
    eps = 1e-6
    numeric = (act.forward(X + eps) - act.forward(X - eps)) / (2 * eps)
    np.testing.assert_allclose(act.backward(dy, X, y), dy * numeric, rtol=1e-7, atol=1e-9)


def test_the_forward_formulas():
    Phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in X])
    np.testing.assert_array_equal(A.relu(X), np.where(X > 0, X, 0.0))
    np.testing.assert_allclose(A.gelu_erf(X), X * Phi, rtol=1e-15, atol=1e-15)
    u = math.sqrt(2 / math.pi) * (X + 0.044715 * X ** 3)
    np.testing.assert_allclose(A.gelu_tanh(X), 0.5 * X * (1 + np.tanh(u)), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(A.silu(X), X / (1 + np.exp(-X)), rtol=1e-15, atol=1e-15)


def test_silu_keeps_its_tails_without_overflow():
    """Far out, e^-x overflows and 1 - 1/(1 + e^x) rounds to 0: SiLU of -80 is -80 e^-80 (a normal
    float32), not 0 or NaN, and SiLU of 1000 is 1000."""
    with np.errstate(over="raise", invalid="raise"):
        for dtype in (np.float32, np.float64):
            x = np.array([-1000.0, -80.0, 1000.0], dtype=dtype)
            y = A.silu(x)
            assert y.dtype == dtype
            np.testing.assert_allclose(y, [0.0, -80.0 * np.exp(-80.0), 1000.0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("tuned", [False, True])
def test_gelu_tanh_records_the_form_that_ran(tuned):
    from core.model.tuned import forward as TF

    with recording() as ran:
        A.gelu_tanh(X, tuned)
    assert ran.functions() == [TF.gelu_tanh if tuned else L.gelu_tanh]
