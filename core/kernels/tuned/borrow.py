"""Array views without reference counting, for the inner loops of Numba kernels.

Each view Numba makes of an array (``A[b, h, i]``, ``row[lo:hi]``) holds a reference to the
memory's owner: an atomic increment when made and a decrement when dropped. A kernel that makes a
few views per row of a 64-key attention spent about 10% of its time on them. A view of a
:func:`borrowed` array holds no reference, and neither do the views made from it.

The caller keeps the owner alive for as long as the borrowed array is used: borrow a function's
arguments (its caller holds them for the call), never an array the function itself allocates.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def borrowed(typingctx, x):
    """``x`` (an array argument) without its reference to the memory's owner."""
    if not isinstance(x, types.Array):
        return None

    def codegen(context, builder, signature, args):
        source = context.make_array(x)(context, builder, value=args[0])
        view = context.make_array(x)(context, builder)
        for field in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(view, field, getattr(source, field))
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return x(x), codegen
