"""A GGUF file's quantised matrices as :class:`~core.model.compact.CompactMatrix` weights: the packed
rows stay where they are in the memory-mapped file, and are unpacked when a product needs them.

The file keeps a linear layer's weight as torch does, ``(out, in)``: one packed row per output,
its blocks running along the inputs. We apply ``x @ W`` with ``W (in, out)``, the transpose, so a
weight widens to the transpose of its unpacked rows (a view, no copy). An embedding ``(V, d)`` is
stored as we use it; its :meth:`rows` unpacks only the rows of the tokens at hand. A row order
(``row_order``) permutes the file's rows without touching a block: how llama.cpp's interleaved
query and key rows are put back in transformers' order.
"""
from __future__ import annotations

import numpy as np

from core.model.compact import CompactMatrix
from core.model.gguf import product as P
from core.model.gguf.quants import FORMATS, dequantize


class PackedMatrix(CompactMatrix):
    """A matrix kept as a GGUF tensor's packed rows ``raw (n_rows, row_bytes)``, widened to
    ``dtype``: unpacked to float32 exactly as llama.cpp does, then cast (float64: exact).

    ``transposed``: the matrix is the transpose of the file's rows (a linear layer's weight, in our
    ``x @ W`` orientation); otherwise the rows themselves (an embedding). ``row_order``: the file's
    rows in the order the matrix takes them (None: as stored).
    """

    FORMAT = ""                                          # the ggml format of the packed rows ("Q4_1")

    def __init__(self, raw: np.ndarray, *, transposed: bool, row_order=None, dtype=np.float32):
        self.format = next(f for f in FORMATS.values() if f.name == self.FORMAT)
        self.raw = raw
        self.transposed = bool(transposed)
        self.row_order = None if row_order is None else np.asarray(row_order, dtype=np.int64)
        self.dtype = np.dtype(dtype)
        n_rows, n_cols = raw.shape[0], raw.shape[1] // self.format.nbytes * self.format.block
        if self.row_order is not None and not np.array_equal(np.sort(self.row_order), np.arange(n_rows)):
            raise ValueError(f"row_order must order the {n_rows} rows, each once.")
        self.shape = (n_cols, n_rows) if self.transposed else (n_rows, n_cols)
        self._order = np.arange(n_rows) if self.row_order is None else self.row_order   # output n reads this row

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes + (0 if self.row_order is None else self.row_order.nbytes)

    def widen(self) -> np.ndarray:
        values = self._unpack(self.row_order)            # (n_rows, n_cols), the file's rows in our order
        values = values.T if self.transposed else values
        values.setflags(write=False)
        return values

    def rows(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= self.shape[0])):
            raise ValueError(f"Row ids must be whole numbers in 0..{self.shape[0] - 1}.")
        if self.transposed:                              # our rows cut across the blocks: unpack them all
            return self.widen()[ids]
        flat = ids.reshape(-1)
        values = self._unpack(flat if self.row_order is None else self.row_order[flat])
        return values.reshape(ids.shape + (self.shape[1],))

    def multiplies(self, transposed: bool = False) -> bool:
        """A float32 matrix in one of :data:`core.model.gguf.product.FORMATS`, used as its packed rows'
        transpose: a linear layer's weight, or a token table's transpose (a tied unembedding)."""
        return self.FORMAT in P.FORMATS and self.dtype == np.float32 and transposed != self.transposed

    def product(self, x: np.ndarray, bias=None, transposed: bool = False) -> np.ndarray | None:
        if not self.multiplies(transposed):
            return None
        return P.rows_product_if_loaded(x, self.raw, self._order, self.FORMAT, bias)

    def joined_product(self, x: np.ndarray, matrices, gated: bool = False) -> np.ndarray | None:
        """One product for weights of this format and input width (a layer's query, key and value
        weights; SwiGLU's gate and up): :func:`core.model.gguf.product.joined_product_if_loaded`."""
        if not all(isinstance(m, PackedMatrix) and m.FORMAT == self.FORMAT and m.multiplies()
                   and m.shape[0] == self.shape[0] for m in matrices):
            return None
        return P.joined_product_if_loaded(x, [(m.raw, m._order) for m in matrices], self.FORMAT, gated)

    def _unpack(self, file_rows) -> np.ndarray:
        return dequantize(self.raw, self.format, file_rows).astype(self.dtype, copy=False)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, {self.nbytes:,} bytes"
                f"{', transposed' if self.transposed else ''}{', rows reordered' if self.row_order is not None else ''})")


class F16Matrix(PackedMatrix):
    FORMAT = "F16"


class Q8_0Matrix(PackedMatrix):
    FORMAT = "Q8_0"


class Q4_0Matrix(PackedMatrix):
    FORMAT = "Q4_0"


class Q4_1Matrix(PackedMatrix):
    FORMAT = "Q4_1"


class Q4_KMatrix(PackedMatrix):
    FORMAT = "Q4_K"


class Q6_KMatrix(PackedMatrix):
    FORMAT = "Q6_K"


MATRICES = {cls.FORMAT: cls for cls in (F16Matrix, Q8_0Matrix, Q4_0Matrix, Q4_1Matrix, Q4_KMatrix, Q6_KMatrix)}
