"""Packed matrices: a weight widens to the transpose of its unpacked rows, an embedding's rows unpack
alone, a row order permutes whole rows, and float64 is float32's unpacking cast exactly."""
import numpy as np
import pytest

from core.model.compact import CompactMatrix, wide
from core.model.gguf.matrix import MATRICES, Q4_1Matrix, Q8_0Matrix
from core.model.gguf.quants import FORMATS, dequantize
from oracle_support import require

Q4_1 = next(f for f in FORMATS.values() if f.name == "Q4_1")


def packed(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    gguf = require("gguf")
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[name])


def test_a_weight_widens_to_the_transpose_of_its_rows():
    raw = packed("Q4_1", rows=48, cols=64)                 # the file's (out, in)
    W = Q4_1Matrix(raw, transposed=True)
    assert isinstance(W, CompactMatrix) and W.shape == (64, 48) and W.dtype == np.float32
    values = W.widen()
    assert np.array_equal(values, dequantize(raw, Q4_1).T) and not values.flags.writeable
    assert np.array_equal(wide(W), values) and np.array_equal(W.rows(np.array([5, 0])), values[[5, 0]])
    assert W.nbytes == raw.nbytes == 48 * 2 * 20


def test_an_embedding_unpacks_only_the_rows_asked_for():
    raw = packed("Q8_0", rows=50, cols=32)
    E = Q8_0Matrix(raw, transposed=False)
    ids = np.array([[3, 49], [0, 3]])
    assert E.shape == (50, 32)
    assert np.array_equal(E.rows(ids), dequantize(raw, FORMATS[8])[ids])              # (2, 2, 32)
    for bad in (np.array([50]), np.array([-1]), np.array([0.5])):
        with pytest.raises(ValueError, match="Row ids"):
            E.rows(bad)


def test_a_row_order_moves_whole_rows():
    raw = packed("Q4_1", rows=6, cols=32, seed=2)
    order = np.array([1, 0, 3, 2, 5, 4])
    W, E = Q4_1Matrix(raw, transposed=True, row_order=order), Q4_1Matrix(raw, transposed=False, row_order=order)
    rows = dequantize(raw, Q4_1)
    assert np.array_equal(W.widen(), rows[order].T) and np.array_equal(E.widen(), rows[order])
    assert np.array_equal(E.rows(np.array([0, 5])), rows[[1, 4]])
    with pytest.raises(ValueError, match="row_order"):
        Q4_1Matrix(raw, transposed=True, row_order=[0, 0, 1, 2, 3, 4])


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_float64_is_the_float32_unpacking_cast_exactly(name):
    fmt = next(f for f in FORMATS.values() if f.name == name)
    raw = np.random.default_rng(4).integers(0, 256, (4, 2 * fmt.nbytes), dtype=np.uint8)     # any bytes
    M64, M32 = MATRICES[name](raw, transposed=True, dtype=np.float64), MATRICES[name](raw, transposed=True)
    assert M64.shape == (2 * fmt.block, 4) and M64.widen().dtype == np.float64
    assert np.array_equal(M64.widen(), M32.widen().astype(np.float64), equal_nan=True)
