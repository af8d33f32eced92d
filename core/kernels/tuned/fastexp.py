"""A float32 ``exp`` that LLVM can vectorise, for softmaxes inside Numba kernels.

``math.exp`` compiles to a call into libm: one scalar call per element (a few ns), and a loop that
contains it never runs in SIMD lanes. Cephes' ``expf`` is arithmetic only (a floor, a polynomial
and an exponent built from bits), so a loop of it vectorises: several times faster for float32.

- :func:`exp_f32` scalar, arguments ``<= 88``; below -87 it returns exactly 0 (``exp(-inf) = 0``,
  so additive ``-inf`` masks still give exactly zero weight).
- :func:`fast_exp` picks :func:`exp_f32` for float32 and ``math.exp`` for float64 at compile time
  (float64 results are tested to 1e-12, beyond the polynomial's 1e-7).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from core.kernels.tuned.floatbits import float_from_bits


@njit(cache=True)
def _expf_parts(v):
    """``exp(v) = p * 2**n`` for float32 ``v`` in [-87, 88]: returns ``p`` and the float32 bits of ``2**n``.

    Cephes' ``expf``: ``v = n ln2 + r`` with ``|r| <= ln2 / 2`` (ln2 split in two so ``r`` is exact),
    ``exp(r)`` by a degree-7 polynomial; relative error about 1e-7.
    """
    n = np.floor(v * np.float32(1.44269504) + np.float32(0.5))
    r = v - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return p * r * r + r + np.float32(1.0), np.int32((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(cache=True)
def exp_f32(x):
    """``exp(x)`` for float32 ``x <= 88``, vectorisable; exactly 0 below -87 (and for -inf)."""
    v = np.float32(x)
    live = v >= np.float32(-87.0)
    v = v if live else np.float32(-87.0)   # keeps 2**n a normal number; the result is dropped below
    p, bits = _expf_parts(v)
    e = p * float_from_bits(bits)
    return e if live else np.float32(0.0)


def fast_exp(x):
    """``exp(x)``: :func:`exp_f32` for float32, ``math.exp`` otherwise (chosen when compiled)."""
    return math.exp(x)


@overload(fast_exp)
def _fast_exp_overload(x):
    if x == types.float32:
        return lambda x: exp_f32(x)
    return lambda x: math.exp(x)

