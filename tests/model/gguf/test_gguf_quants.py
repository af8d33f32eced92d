"""The unpacking loops against gguf-py's ``dequantize`` (llama.cpp's own Python library), bit for bit:
on random blocks of every format and on every tensor of the packaged SmolLM2 file."""
import numpy as np
import pytest
from numba import njit

from core.model.gguf import quants as Q
from oracle_support import require

FORMATS = {f.name: f for f in Q.FORMATS.values()}


def random_blocks(fmt, n_rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random packed rows whose half-precision scales are finite (random bytes elsewhere)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n_rows, blocks_per_row, fmt.nbytes), dtype=np.uint8)
    scales = {"F16": [0], "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}[fmt.name]
    for at in scales:                                    # a half in [-2, 2]: its exponent byte's top bits clear
        raw[..., at + 1] &= 0b10111111
    return raw.reshape(n_rows, -1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float32 bit patterns (so -0.0 is not 0.0), NaN where the other has NaN."""
    nan = np.isnan(a)
    return a.shape == b.shape and np.array_equal(nan, np.isnan(b)) and \
        np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


@njit            # not cached: a cache here would not see a change to quants.half
def _every_half(out):
    for bits in range(65536):
        out[bits] = Q.half(bits & 0xFF, bits >> 8)


@njit
def _every_half_from_bits(out):
    for bits in range(65536):
        out[bits] = Q.half_from_bits(bits)


def test_half_reads_every_bit_pattern_as_numpy_does():
    numpy = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    ours = np.empty(65536, dtype=np.float32)
    _every_half(ours)                                    # the table the unpacking loops read
    assert same_bits(ours, numpy)                        # zeros, subnormals, normals, infinities, NaNs
    _every_half_from_bits(ours)                          # the formula the lesson reads
    assert same_bits(ours, numpy)


@pytest.mark.parametrize("name", sorted(name for name, f in FORMATS.items() if f.rows is not None))  # F32: as is
def test_each_format_unpacks_random_blocks_as_gguf_py(name):
    gguf = require("gguf")
    fmt = FORMATS[name]
    raw = random_blocks(fmt, n_rows=5, blocks_per_row=3, seed=len(name))
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    assert same_bits(Q.dequantize(raw, fmt), expected)


def test_quantised_real_values_unpack_as_gguf_py():
    """Blocks gguf-py itself packed from normal weights (codes spread as a real file's are)."""
    gguf = require("gguf")
    w = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32) * 0.05
    for name in ("Q8_0", "Q4_0", "Q4_1"):
        qtype = gguf.GGMLQuantizationType[name]
        packed = gguf.quants.quantize(w, qtype)
        assert same_bits(Q.dequantize(packed, FORMATS[name]), gguf.quants.dequantize(packed, qtype)), name


def test_chosen_rows_are_those_rows_in_that_order():
    fmt = FORMATS["Q4_1"]
    raw = random_blocks(fmt, n_rows=7, blocks_per_row=2, seed=3)
    whole = Q.dequantize(raw, fmt)
    assert same_bits(Q.dequantize(raw, fmt, np.array([6, 0, 3, 3])), whole[[6, 0, 3, 3]])
    with pytest.raises(ValueError, match="Row ids"):
        Q.dequantize(raw, fmt, np.array([7]))          # past the last row: refused, never read


def test_every_tensor_of_the_packaged_file_unpacks_as_gguf_py(smollm2_file):
    """All 272 tensors (Q4_1, Q8_0, F32) of SmolLM2, read by gguf-py's reader and unpacked by both."""
    gguf = require("gguf")
    checked = 0
    for tensor in gguf.GGUFReader(smollm2_file).tensors:
        fmt = Q.FORMATS[int(tensor.tensor_type)]
        raw = np.asarray(tensor.data).view(np.uint8).reshape(tensor.data.shape[0] if tensor.data.ndim > 1 else 1, -1)
        ours = Q.dequantize(raw, fmt).reshape(tensor.data.shape[:-1] + (-1,))
        assert same_bits(ours, np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type))), tensor.name
        checked += 1
    assert checked == 272


def test_formats_name_their_ggml_type_numbers_as_gguf_py_does():
    gguf = require("gguf")
    for type_id, fmt in Q.FORMATS.items():
        assert gguf.GGMLQuantizationType(type_id).name == fmt.name
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)] == (fmt.block, fmt.nbytes)
    for type_id, name in Q.OTHER_TYPES.items():
        assert gguf.GGMLQuantizationType(type_id).name == name


def test_a_format_not_read_here_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'blk.0.attn_q.weight' is stored as Q5_K.*reads F32, F16, Q4_0, Q4_1"):
        Q.format_of(13, "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="unknown type \\(number 99\\)"):
        Q.format_of(99, "x")
