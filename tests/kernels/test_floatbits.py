"""The integer-order maximum used by the softmax kernels, against NumPy."""
import numpy as np
from hypothesis import given, settings, strategies as st
from numba import njit

from core.kernels.tuned.floatbits import float_bits, float_from_bits, max_of


@njit
def _max_of(x, start):
    return max_of(x, start)


@njit
def _round_trip(x):
    return float_from_bits(float_bits(x))


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_max_of_matches_numpy(dtype, data):
    """Any floats without NaN: negatives, -0.0, subnormals, -inf, the dtype's extremes."""
    floats = st.floats(allow_nan=False, width=32 if dtype == np.float32 else 64)
    x = np.array(data.draw(st.lists(floats, min_size=0, max_size=40)), dtype=dtype)
    start = dtype(data.draw(floats))
    expected = max(start, x.max()) if x.size else start
    assert _max_of(x, start) == expected


def test_all_minus_infinity_rows_stay_minus_infinity():
    for dtype in (np.float32, np.float64):
        row = np.full(37, -np.inf, dtype)
        assert _max_of(row, dtype(-np.inf)) == -np.inf
        row[20] = -1e30
        assert _max_of(row, dtype(-np.inf)) == dtype(-1e30)


def test_bits_round_trip_exactly():
    for x in (np.float32(-0.0), np.float32(1.5e-45), np.float64(-2.2e-308), np.float64(np.inf)):
        y = _round_trip(x)
        assert y == x and np.signbit(y) == np.signbit(x)
