"""The vectorisable float32 exp against NumPy's, including the ends that softmax masks rely on."""
import math

import numpy as np
from numba import njit

from core.kernels.tuned import fastexp, simd


@njit
def _exp_each(x, out):
    for i in range(x.shape[0]):
        out[i] = fastexp.fast_exp(x[i])


@njit
def _exp_by_vectors(x, out):
    for i in range(0, x.shape[0], simd.lanes_of(x)):
        simd.store(out, i, fastexp.exp_vector(simd.load(x, i), x))


def _grid():
    return np.concatenate([np.linspace(-120.0, 88.0, 20001), [-87.5, -87.0, -86.9, -1e-7, 0.0, 1e-7]])


def test_float32_exp_matches_numpy():
    x = _grid().astype(np.float32)
    got = np.empty_like(x)
    _exp_each(x, got)
    assert got.dtype == np.float32
    want = np.exp(x.astype(np.float64))
    live = x >= -87.0
    np.testing.assert_allclose(got[live], want[live], rtol=5e-7)
    assert (got[~live] == 0.0).all()            # flushed to exactly zero, not 1e-38
    assert got[x == 0.0][0] == 1.0


def test_minus_infinity_gives_exactly_zero():
    x = np.array([-np.inf, -1e30, -88.0, -87.0], np.float32)
    got = np.empty_like(x)
    _exp_each(x, got)
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] == 0.0
    assert got[3] > 0.0


def test_float64_keeps_math_exp():
    x = _grid()
    got = np.empty_like(x)
    _exp_each(x, got)
    np.testing.assert_array_equal(got, [math.exp(v) for v in x])



def test_the_vector_exp_matches_numpy_and_masks_like_the_scalar_one():
    L = simd.lanes(np.dtype(np.float32))
    x = np.concatenate([_grid(), [-np.inf, np.nan]]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-x.size % L, np.float32)])   # whole vectors
    got = np.empty_like(x)
    _exp_by_vectors(x, got)
    live = x >= -87.0
    np.testing.assert_allclose(got[live], np.exp(x[live].astype(np.float64)), rtol=5e-7)
    assert (got[~live] == 0.0).all()          # -inf, below -87 and NaN: exactly 0
    assert got[x == 0.0][0] == 1.0
