"""A float32 ``exp`` that LLVM can vectorise, for softmaxes inside Numba kernels.

``math.exp`` compiles to a call into libm: one scalar call per element (a few ns), and a loop that
contains it never runs in SIMD lanes. Cephes' ``expf`` is arithmetic only (a floor, a polynomial
and an exponent built from bits), so a loop of it vectorises: several times faster for float32.

- :func:`exp_f32` scalar, arguments ``<= 88``; below -87 it returns exactly 0 (``exp(-inf) = 0``,
  so additive ``-inf`` masks still give exactly zero weight).
- :func:`fast_exp` picks :func:`exp_f32` for float32 and ``math.exp`` for float64 at compile time
  (float64 results are tested to 1e-12, beyond the polynomial's 1e-7).
- :func:`exp_vector`: :func:`exp_f32` on every lane of a float32 SIMD vector (see simd.py).
- :func:`silu`, :func:`gelu_tanh`: the activations written as ``x / (1 + exp(-u))``, once for every
  kernel that computes them (a pass of their own, or fused into a matrix product); beside them
  :func:`gelu_erf`, the exact GELU with erf as a rational fit (no exp, and no libm call either).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from core.kernels.tuned import simd
from core.kernels.tuned.floatbits import float_from_bits


# Cephes' expf: exp(v) = 2**n exp(r) with v = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts, so that r
# is exact), and exp(r) = 1 + r + r^2 P(r), P of degree 5 (its coefficients, highest first): relative
# error about 1e-7. Shared by the scalar and the vector exp.
LOG2_E = 1.44269504
LN2_HIGH, LN2_LOW = 0.693359375, -2.12194440e-4
P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
LOWEST = -87.0         # below it the result is 0, and 2**n would no longer be a normal float32


# The argument the callers that divide by 1 + exp(-u) (GELU's sigmoid form, SiLU) hold exp at or
# below: float32's exp is defined up to 88, and 1 / (1 + e^80) times any activation is far below
# a float32 rounding of it.
EXP_MAX = 80.0


@njit(cache=True)
def _expf_parts(v):
    """``exp(v) = p * 2**n`` for float32 ``v`` in [-87, 88]: returns ``p`` and the float32 bits of ``2**n``."""
    n = np.floor(v * np.float32(LOG2_E) + np.float32(0.5))
    r = v - n * np.float32(LN2_HIGH) - n * np.float32(LN2_LOW)
    p = np.float32(P[0])
    p = p * r + np.float32(P[1])           # written out: a loop over P's numbers vectorised worse
    p = p * r + np.float32(P[2])
    p = p * r + np.float32(P[3])
    p = p * r + np.float32(P[4])
    p = p * r + np.float32(P[5])
    return p * r * r + r + np.float32(1.0), np.int32((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(cache=True)
def exp_f32(x):
    """``exp(x)`` for float32 ``x <= 88``, vectorisable; exactly 0 below -87 (and for -inf)."""
    v = np.float32(x)
    live = v >= np.float32(LOWEST)
    v = v if live else np.float32(LOWEST)  # keeps 2**n a normal number; the result is dropped below
    p, bits = _expf_parts(v)
    e = p * float_from_bits(bits)
    return e if live else np.float32(0.0)


@njit(inline="always")
def exp_vector(x, like):
    """:func:`exp_f32` lane by lane, on a vector ``x`` of float32 (``like``: a float32 array, the
    vectors' type). Cephes' expf: ``x = n ln2 + r`` with ``n = round(x log2(e))``, ln 2 in two parts
    (``LN2_HIGH + LN2_LOW``) so that ``r`` is exact; ``exp(r) = 1 + r + r^2 P(r)``, the polynomial's
    coefficients in ``P``; and ``2**n`` written into the exponent bits by :func:`simd.pow2`."""
    lowest = simd.splat(LOWEST, like)
    live = x >= lowest
    v = simd.where(live, x, lowest)        # keeps 2**n normal; the lane is dropped below
    n = simd.floor(simd.fma(v, simd.splat(LOG2_E, like), simd.splat(0.5, like)))
    r = simd.fma(n, simd.splat(-LN2_HIGH, like), v)
    r = simd.fma(n, simd.splat(-LN2_LOW, like), r)
    p = simd.splat(P[0], like)
    p = simd.fma(p, r, simd.splat(P[1], like))
    p = simd.fma(p, r, simd.splat(P[2], like))
    p = simd.fma(p, r, simd.splat(P[3], like))
    p = simd.fma(p, r, simd.splat(P[4], like))
    p = simd.fma(p, r, simd.splat(P[5], like))
    e = simd.fma(p * r, r, r + simd.splat(1.0, like)) * simd.pow2(n)
    return simd.where(live, e, simd.zeros(like))


def fast_exp(x):
    """``exp(x)``: :func:`exp_f32` for float32, ``math.exp`` otherwise (chosen when compiled)."""
    return math.exp(x)


@overload(fast_exp)
def _fast_exp_overload(x):
    if x == types.float32:
        return lambda x: exp_f32(x)
    return lambda x: math.exp(x)



@njit(inline="always")
def silu(v, one, top):
    """SiLU, ``v sigmoid(v) = v / (1 + exp(-v))``, with ``-v`` held at or below ``top`` (:data:`EXP_MAX`:
    beyond it the result is 0 to the last bit either way); ``one`` is 1 in ``v``'s dtype."""
    return v / (one + fast_exp(min(-v, top)))


@njit(inline="always")
def gelu_tanh(v, c, a, one, top):
    """GELU's tanh form, ``0.5 v (1 + tanh u) = v / (1 + exp(-2u))`` with ``u = c (v + a v^3)``
    (``c = sqrt(2 / pi)``, ``a = 0.044715``), ``-2u`` held at or below ``top``."""
    return v / (one + fast_exp(min(-(c + c) * (v + a * v * v * v), top)))


# erf(z) ~ z P(z^2) / Q(z^2) on [-4, 4], and +-1 beyond (as erf is, to float32's precision): a
# rational fit good to 7e-8, with no libm call, so LLVM puts a loop of it on SIMD lanes (a float32
# GELU over 1.2M numbers: 0.5 ms, against 22 ms for math.erf, one scalar call per element).
# A kernel that divides by Q needs error_model="numpy": Python's check for a zero divisor would
# keep its loop scalar (Q < 0 here).
ERF_P = tuple(np.float32(c) for c in (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
                                      -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
                                      -2.72614225801306e-10))
ERF_Q = tuple(np.float32(c) for c in (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
                                      -2.13374055278905e-04, -1.45660718464996e-05))
_SQRT_HALF, _ERF_EDGE, _HALF, _ONE = (np.float32(c) for c in (1.0 / math.sqrt(2.0), 4.0, 0.5, 1.0))


@njit(inline="always")
def gelu_erf(v):
    """The exact GELU ``0.5 v (1 + erf(v / sqrt 2))`` of a float32 ``v``, erf from the rational fit
    above (``z`` held to [-4, 4])."""
    p0, p1, p2, p3, p4, p5, p6 = ERF_P
    q0, q1, q2, q3, q4 = ERF_Q
    z = v * _SQRT_HALF
    z = _ERF_EDGE if z > _ERF_EDGE else z
    z = -_ERF_EDGE if z < -_ERF_EDGE else z
    z2 = z * z
    p = z * (p0 + z2 * (p1 + z2 * (p2 + z2 * (p3 + z2 * (p4 + z2 * (p5 + z2 * p6))))))
    q = q0 + z2 * (q1 + z2 * (q2 + z2 * (q3 + z2 * q4)))
    return _HALF * v * (_ONE + p / q)
