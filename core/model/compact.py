"""Weights kept compact and widened to floats only where a product needs them.

A quantised checkpoint (SmolLM2's GGUF: 4.5 to 8.5 bits a weight) widened whole to float32 would take
540 MB, more than a small server can give one model. A :class:`CompactMatrix` keeps the file's form
(read in place) and widens on use: a block's weights when the forward pass reaches that block, an
embedding's rows for the tokens at hand, the unembedding a slice of the vocabulary at a time.

The one transformer reads a parameter through :func:`wide` (a NumPy array stays as it is), so a
compact weight and a float one run the same readable code. A compact form that has a product of its
own (:meth:`CompactMatrix.product`: GGUF's 4- and 8-bit blocks, read by
:mod:`core.model.gguf.product`) is not widened at all: its linear layers multiply it as it is
(:func:`for_products`).
"""
from __future__ import annotations

import numpy as np


class CompactMatrix:
    """A 2-D weight in a compact form. ``shape`` and ``dtype`` are those of the float array it widens
    to, in our orientation (``W`` such that a product is ``x @ W``; an embedding ``(V, d)``)."""

    shape: tuple[int, int]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes it holds in its compact form."""
        raise NotImplementedError

    def widen(self) -> np.ndarray:
        """The whole matrix as a float array of ``shape`` and ``dtype`` (read-only; may be a view)."""
        raise NotImplementedError

    def rows(self, ids) -> np.ndarray:
        """Rows ``ids`` (an int array of any shape) widened: ``ids.shape + (shape[1],)``."""
        raise NotImplementedError

    def multiplies(self, transposed: bool = False) -> bool:
        """Whether :meth:`product` can multiply by this matrix (its transpose) in its compact form."""
        return False

    def product(self, x: np.ndarray, bias=None, transposed: bool = False) -> np.ndarray | None:
        """``x @ M + bias`` (``x @ M^T`` if ``transposed``) for ``x`` (rows, K), read in the compact
        form; None where that cannot run (not :meth:`multiplies`, or its kernel still compiling):
        the caller widens the matrix instead."""
        return None

    def joined_product(self, x: np.ndarray, matrices, gated: bool = False) -> np.ndarray | None:
        """``x @ [M_0 | M_1 | ...]`` for ``matrices`` (this one first), their outputs side by side in one
        product, or ``gated`` (two): ``silu(x M_0) * (x M_1)``; None where they have no such product
        together: the caller multiplies them one by one."""
        return None


def wide(value):
    """A parameter as a float array: a compact one widened, an array as it is."""
    return value.widen() if isinstance(value, CompactMatrix) else value


def for_products(value):
    """A parameter as a linear layer multiplies it: a compact one that :meth:`~CompactMatrix.multiplies`
    as it is, any other widened (:func:`wide`)."""
    return value if isinstance(value, CompactMatrix) and value.multiplies() else wide(value)
