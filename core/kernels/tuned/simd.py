"""SIMD vectors inside Numba kernels: the few operations a register-tiled microkernel needs.

LLVM's auto-vectoriser vectorises one innermost loop at a time. A matrix-product tile wants more:
a few vectors of running sums that stay in registers while a loop over the shared axis feeds them
(for the scores ``S = Q K^T``, four queries by two or four vectors of keys, summed over the features). Written as
scalar loops, those sums go back to memory on every pass; written with these vectors, they are
registers, as in a hand-written BLAS kernel (1.2-2x faster scores here, T = 512 to 64).

A vector holds :func:`lanes` floats of one dtype: as many as fit the widest SIMD register of the
CPU Numba compiles for (64 bytes with AVX-512, 32 with AVX, else 16), which is the host's unless
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name another (see ``target.py``). LLVM splits a vector
wider than the registers into several, so every width is correct everywhere; the target's is the
fast one.

- :func:`load` / :func:`store`: a vector from / to ``x[i : i + lanes]`` (1-D, contiguous; the
  caller keeps ``i + lanes <= len(x)``, by padding its arrays to whole vectors);
- :func:`lanes_of`: the lane count for an array's dtype;
- :func:`splat`: one number in every lane; :func:`zeros`;
- :func:`fma`: ``a * b + c`` lane by lane; :func:`add`; and ``+ - *`` between two vectors;
- :func:`floor`; :func:`pow2`: ``2**n`` for lanes holding whole numbers, built from bits;
- comparisons (``<``, ``>=``) give a :class:`Mask`, one true/false per lane; ``&`` combines two;
  :func:`where` picks lane by lane; :func:`lane_numbers`: ``0, 1, ..., lanes - 1``;
- :func:`total`: the sum of a vector's lanes;
- :func:`low_nibbles`, :func:`high_nibbles`, :func:`signed_bytes`: ``lanes`` bytes of a ``uint8``
  array read as small whole numbers in a float vector (a quantised weight's codes).
"""
from __future__ import annotations

import operator

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

from core.kernels.tuned.target import VECTOR_BYTES


def lanes(dtype) -> int:
    """Floats of ``dtype`` per vector (16 float32 or 8 float64 with AVX-512)."""
    return VECTOR_BYTES // dtype.itemsize


def lanes_of(x):
    """:func:`lanes` of an array's dtype, as a constant inside Numba kernels."""
    return lanes(x.dtype)


@overload(lanes_of)
def _lanes_of_overload(x):
    n = VECTOR_BYTES // (x.dtype.bitwidth // 8)
    return lambda x: n


class Vector(types.Type):
    """``lanes`` floats of ``dtype``, held in SIMD registers (an LLVM ``<lanes x float>``)."""

    def __init__(self, dtype):
        self.dtype, self.lanes = dtype, VECTOR_BYTES // (dtype.bitwidth // 8)
        super().__init__(name=f"Vector({dtype} x {self.lanes})")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(element, fe_type.lanes))


def _is_float_array(x) -> bool:
    return isinstance(x, types.Array) and x.ndim == 1 and x.dtype in (types.float32, types.float64)


def _vector_pointer(context, builder, array_type, array, i, vector_type):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [i]), context.get_value_type(vector_type).as_pointer())


@intrinsic
def load(typingctx, x, i):
    """``x[i : i + lanes]`` as a vector (``x`` 1-D and contiguous; no bounds check)."""
    if not (_is_float_array(x) and isinstance(i, types.Integer)):
        return None
    vector = Vector(x.dtype)

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, x, args[0], args[1], vector)
        return builder.load(pointer, align=x.dtype.bitwidth // 8)

    return vector(x, i), codegen


@intrinsic
def store(typingctx, x, i, v):
    """``x[i : i + lanes] = v`` (``x`` 1-D and contiguous; no bounds check)."""
    if not (_is_float_array(x) and isinstance(i, types.Integer) and v == Vector(x.dtype)):
        return None

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, x, args[0], args[1], v)
        builder.store(args[2], pointer, align=x.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.none(x, i, v), codegen


@intrinsic
def splat(typingctx, value, like):
    """``value`` in every lane of a vector of the array ``like``'s dtype."""
    if not (isinstance(like, types.Array) and isinstance(value, (types.Float, types.Integer))):
        return None
    vector = Vector(like.dtype)

    def codegen(context, builder, signature, args):
        vector_type = context.get_value_type(vector)
        scalar = context.cast(builder, args[0], value, like.dtype)
        one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
        every_lane = ir.Constant(ir.VectorType(ir.IntType(32), vector.lanes), [0] * vector.lanes)
        return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined), every_lane)

    return vector(value, like), codegen


def zeros(like):
    """A vector of zeros of the array ``like``'s dtype."""
    raise NotImplementedError("only inside Numba kernels")


@overload(zeros)
def _zeros_overload(like):
    return lambda like: splat(0, like)


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` lane by lane, one rounding (the CPU's fused multiply-add)."""
    if not (isinstance(a, Vector) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        vector_type = context.get_value_type(a)
        name = f"llvm.fma.v{a.lanes}f{a.dtype.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector_type, [vector_type] * 3), name)
        return builder.call(fn, args)

    return a(a, b, c), codegen


@intrinsic
def add(typingctx, a, b):
    """``a + b`` lane by lane."""
    if not (isinstance(a, Vector) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return a(a, b), codegen


def _overload_operator(python_operator, implementation, symbol):
    """``a <op> b`` for two vectors of one type, as ``implementation(a, b, symbol)``."""
    @overload(python_operator)
    def _vector_operator(a, b):
        if isinstance(a, Vector) and a == b:
            return lambda a, b: implementation(a, b, symbol)
        return None


@intrinsic
def _arithmetic(typingctx, a, b, symbol):
    if not (isinstance(a, Vector) and a == b and isinstance(symbol, types.StringLiteral)):
        return None
    instruction = {"-": "fsub", "*": "fmul"}[symbol.literal_value]

    def codegen(context, builder, signature, args):
        return getattr(builder, instruction)(args[0], args[1])

    return a(a, b, symbol), codegen


for _symbol, _operator in (("-", operator.sub), ("*", operator.mul)):
    _overload_operator(_operator, _arithmetic, _symbol)


@overload(operator.add)
def _add_operator(a, b):
    if isinstance(a, Vector) and a == b:
        return lambda a, b: add(a, b)
    return None


@intrinsic
def floor(typingctx, v):
    """The largest whole number ``<= v``, lane by lane."""
    if not isinstance(v, Vector):
        return None

    def codegen(context, builder, signature, args):
        vector_type = context.get_value_type(v)
        name = f"llvm.floor.v{v.lanes}f{v.dtype.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector_type, [vector_type]), name)
        return builder.call(fn, [args[0]])

    return v(v), codegen


@intrinsic
def pow2(typingctx, n):
    """``2**n`` for lanes holding whole numbers ``n`` in the normal range (-126 to 127 for float32):
    ``n`` plus the exponent's bias, written into the exponent bits."""
    if not isinstance(n, Vector):
        return None
    bits = n.dtype.bitwidth
    mantissa_bits, bias = {32: (23, 127), 64: (52, 1023)}[bits]

    def codegen(context, builder, signature, args):
        int_type = ir.VectorType(ir.IntType(bits), n.lanes)
        biased = builder.add(builder.fptosi(args[0], int_type), ir.Constant(int_type, [bias] * n.lanes))
        exponent = builder.shl(biased, ir.Constant(int_type, [mantissa_bits] * n.lanes))
        return builder.bitcast(exponent, context.get_value_type(n))

    return n(n), codegen


class Mask(types.Type):
    """One true/false per lane of a :class:`Vector` (an LLVM ``<lanes x i1>``)."""

    def __init__(self, lanes):
        self.lanes = lanes
        super().__init__(name=f"Mask({lanes})")


@register_model(Mask)
class _MaskModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(ir.IntType(1), fe_type.lanes))


@intrinsic
def _compare(typingctx, a, b, symbol):
    if not (isinstance(a, Vector) and a == b and isinstance(symbol, types.StringLiteral)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fcmp_ordered(symbol.literal_value, args[0], args[1])   # false where a lane is NaN

    return Mask(a.lanes)(a, b, symbol), codegen


for _symbol, _operator in (("<", operator.lt), (">=", operator.ge)):
    _overload_operator(_operator, _compare, _symbol)


@intrinsic
def _both(typingctx, a, b):
    if not (isinstance(a, Mask) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.and_(args[0], args[1])

    return a(a, b), codegen


@overload(operator.and_)
def _and_overload(a, b):
    if isinstance(a, Mask) and a == b:
        return lambda a, b: _both(a, b)
    return None


@intrinsic
def where(typingctx, mask, a, b):
    """``a`` in the lanes where ``mask`` is true, ``b`` in the others."""
    if not (isinstance(mask, Mask) and isinstance(a, Vector) and a == b and mask.lanes == a.lanes):
        return None

    def codegen(context, builder, signature, args):
        return builder.select(args[0], args[1], args[2])

    return a(mask, a, b), codegen


@intrinsic
def lane_numbers(typingctx, like):
    """``0, 1, ..., lanes - 1`` as a vector of the array ``like``'s dtype."""
    if not isinstance(like, types.Array):
        return None
    vector = Vector(like.dtype)

    def codegen(context, builder, signature, args):
        return ir.Constant(context.get_value_type(vector), [float(k) for k in range(vector.lanes)])

    return vector(like), codegen


@intrinsic
def total(typingctx, v):
    """The sum of a vector's lanes, as a tree of adds (the upper half of the lanes onto the lower
    half, and again): a fixed order, so the same bits every time."""
    if not isinstance(v, Vector):
        return None

    def codegen(context, builder, signature, args):
        x, n = args[0], v.lanes
        while n > 1:
            n //= 2
            low = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n))))
            high = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n, 2 * n))))
            x = builder.fadd(low, high)
        return builder.extract_element(x, ir.Constant(ir.IntType(32), 0))

    return v.dtype(v), codegen


def _codes(read):
    """An intrinsic ``f(raw, i, like)``: bytes ``raw[i : i + lanes]`` of a 1-D contiguous ``uint8``
    array, each turned into a whole number by ``read(builder, bytes)`` (an LLVM vector of i32), as a
    vector of the array ``like``'s dtype (no bounds check)."""
    def intrinsic_of(typingctx, raw, i, like):
        if not (isinstance(raw, types.Array) and raw.ndim == 1 and raw.layout == "C" and raw.dtype == types.uint8
                and isinstance(i, types.Integer) and isinstance(like, types.Array)
                and like.dtype in (types.float32, types.float64)):
            return None
        vector = Vector(like.dtype)

        def codegen(context, builder, signature, args):
            byte_vector = ir.VectorType(ir.IntType(8), vector.lanes)
            data = context.make_array(raw)(context, builder, args[0]).data
            pointer = builder.bitcast(builder.gep(data, [args[1]]), byte_vector.as_pointer())
            codes = read(builder, builder.load(pointer, align=1), vector.lanes)
            return builder.sitofp(codes, context.get_value_type(vector))

        return vector(raw, i, like), codegen

    intrinsic_of.__doc__ = read.__doc__
    return intrinsic(intrinsic_of)


def _bytes(lanes, value):
    return ir.Constant(ir.VectorType(ir.IntType(8), lanes), [value] * lanes)


def _low(builder, b, lanes):
    """The low four bits of each byte (0..15)."""
    return builder.zext(builder.and_(b, _bytes(lanes, 0x0F)), ir.VectorType(ir.IntType(32), lanes))


def _high(builder, b, lanes):
    """The high four bits of each byte (0..15)."""
    return builder.zext(builder.lshr(b, _bytes(lanes, 4)), ir.VectorType(ir.IntType(32), lanes))


def _signed(builder, b, lanes):
    """Each byte as a signed number (-128..127)."""
    return builder.sext(b, ir.VectorType(ir.IntType(32), lanes))


low_nibbles = _codes(_low)
high_nibbles = _codes(_high)
signed_bytes = _codes(_signed)
