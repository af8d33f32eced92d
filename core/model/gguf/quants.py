"""GGUF's weight formats: how each packs numbers into blocks of bytes, and the loops that unpack them.

A quantised tensor is stored row by row (a row is what one output of a linear layer reads: a
torch ``(out, in)`` weight's row), and each row is cut into blocks of 32 or 256 weights. A block
holds one or two scales as half-precision floats and small integer codes, one per weight::

    Q8_0   32 weights in 34 bytes:  d (f16), 32 codes q (int8)              w = q d
    Q4_0   32 weights in 18 bytes:  d (f16), 32 codes of 4 bits             w = (q - 8) d
    Q4_1   32 weights in 20 bytes:  d (f16), m (f16), 32 codes of 4 bits    w = q d + m
    Q4_K  256 weights in 144 bytes: d, dmin (f16), 8 scales and 8 mins of 6 bits, 256 codes of 4 bits
    Q6_K  256 weights in 210 bytes: 256 codes of 6 bits (4 low, 2 high), 16 scales (int8), d (f16)

The 4-bit codes come two to a byte: in a 32-weight block, byte j holds weight j in its low nibble
and weight j + 16 in its high one. Each loop below unpacks a list of rows into float32, in the
order and with the float32 roundings of llama.cpp's reference code (``ggml-quants.c``), so the
numbers are those gguf-py's ``dequantize`` gives, bit for bit.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit


# ----------------------------------------------------------------------------------------------
# half-precision scales
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def half_from_bits(bits):
    """The IEEE half-precision float with bits ``bits`` (a 16-bit code) as a float32 (exact: every
    half is a float32). Bits: 1 sign, 5 exponent (bias 15), 10 fraction."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exponent = (bits >> 10) & 0x1F
    fraction = bits & 0x3FF
    if exponent == 0:                                    # zero and the subnormals: 0.fraction x 2^-14
        return np.float32(sign * fraction * 2.0 ** -24)
    if exponent == 31:                                   # infinity, or not a number
        return np.float32(sign * math.inf if fraction == 0 else math.nan)
    return np.float32(sign * (1024 + fraction) * 2.0 ** (exponent - 25))     # 1.fraction x 2^(e-15)


# Each block's scales are halves: decoded once here for all 65,536 codes (256 KB), then looked up,
# which makes unpacking a matrix several times faster than decoding its scales block by block.
# NumPy's widening of float16 gives the bits half_from_bits gives, for every code (tested); a
# compiled loop here would compile while a page imports this module (a second, on an empty cache).
HALVES = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
HALVES.setflags(write=False)


@njit(cache=True, nogil=True)
def half(lo, hi):
    """The half-precision float stored little-endian in bytes ``lo, hi``, as a float32: the code's
    entry in the table of every half (:func:`half_from_bits`)."""
    return HALVES[np.int64(lo) | (np.int64(hi) << 8)]


# ----------------------------------------------------------------------------------------------
# one loop per format: raw (n_rows, row_bytes) uint8, rows (k,) int64 -> out (k, n_cols) float32
# ----------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def f16_rows(raw, rows, out):
    """F16: two bytes a weight."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for j in range(out.shape[1]):
            out[k, j] = half(row[2 * j], row[2 * j + 1])


@njit(cache=True, nogil=True)
def q8_0_rows(raw, rows, out):
    """Q8_0: a block is d, then 32 signed bytes; ``w = q d``."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for b in range(out.shape[1] // 32):
            block = row[34 * b:34 * (b + 1)]
            d = half(block[0], block[1])
            for j in range(32):
                q = np.int8(block[2 + j])                # the byte read as a signed code
                out[k, 32 * b + j] = np.float32(q) * d


@njit(cache=True, nogil=True)
def q4_0_rows(raw, rows, out):
    """Q4_0: a block is d, then 16 bytes of two codes; ``w = (q - 8) d``."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for b in range(out.shape[1] // 32):
            block = row[18 * b:18 * (b + 1)]
            d = half(block[0], block[1])
            for j in range(16):
                byte = block[2 + j]
                out[k, 32 * b + j] = d * np.float32(np.int64(byte & 0x0F) - 8)
                out[k, 32 * b + j + 16] = d * np.float32(np.int64(byte >> 4) - 8)


@njit(cache=True, nogil=True)
def q4_1_rows(raw, rows, out):
    """Q4_1: a block is d, m, then 16 bytes of two codes; ``w = q d + m`` (rounded once after the
    product, once after the sum: float32, as llama.cpp)."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for b in range(out.shape[1] // 32):
            block = row[20 * b:20 * (b + 1)]
            d = half(block[0], block[1])
            m = half(block[2], block[3])
            for j in range(16):
                byte = block[4 + j]
                out[k, 32 * b + j] = d * np.float32(byte & 0x0F) + m
                out[k, 32 * b + j + 16] = d * np.float32(byte >> 4) + m


@njit(cache=True, nogil=True)
def _k_scale_min(scales, j):
    """Sub-block ``j``'s 6-bit scale and min from Q4_K's 12 scale bytes (llama.cpp's
    ``get_scale_min_k4``): the first four of each in the low 6 bits of bytes 0-3 and 4-7, the last
    four split between a nibble of bytes 8-11 and the top 2 bits of bytes 0-7."""
    if j < 4:
        return scales[j] & 63, scales[j + 4] & 63
    sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4)
    mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)
    return sc, mn


@njit(cache=True, nogil=True)
def q4_k_rows(raw, rows, out):
    """Q4_K: a super-block of 256 weights, 8 sub-blocks of 32, each with its own 6-bit scale and
    min; ``w = (d sc) q - (dmin mn)``. Bytes: d, dmin, 12 of scales, 128 of codes; each 32 code
    bytes hold sub-block 2c in their low nibbles and sub-block 2c + 1 in their high ones."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for b in range(out.shape[1] // 256):
            block = row[144 * b:144 * (b + 1)]
            d = half(block[0], block[1])
            dmin = half(block[2], block[3])
            scales, codes = block[4:16], block[16:144]
            for sub in range(8):
                sc, mn = _k_scale_min(scales, sub)
                scale = d * np.float32(sc)
                shift = dmin * np.float32(mn)
                chunk, high = sub // 2, sub % 2
                for j in range(32):
                    q = (codes[32 * chunk + j] >> (4 * high)) & 0x0F
                    out[k, 256 * b + 32 * sub + j] = scale * np.float32(q) - shift


@njit(cache=True, nogil=True)
def q6_k_rows(raw, rows, out):
    """Q6_K: a super-block of 256 weights in two halves of 128; ``w = (d s) (q - 32)`` with one
    int8 scale ``s`` per 16 weights. Bytes: 128 of low nibbles, 64 of high 2-bit pairs, 16 scales,
    d. In half h, weight r takes its low 4 bits from byte ``r % 64`` of the half's 64 low bytes
    (low nibble for r < 64, high for r >= 64) and its high 2 bits from bits ``2 (r // 32)`` of
    byte ``r % 32`` of the half's 32 high bytes."""
    for k in range(rows.shape[0]):
        row = raw[rows[k]]
        for b in range(out.shape[1] // 256):
            block = row[210 * b:210 * (b + 1)]
            low, high, scales = block[0:128], block[128:192], block[192:208]
            d = half(block[208], block[209])
            for h in range(2):
                for r in range(128):
                    q_low = (low[64 * h + r % 64] >> (4 * (r // 64))) & 0x0F
                    q_high = (high[32 * h + r % 32] >> (2 * (r // 32))) & 0x03
                    q = np.int64(q_low | (q_high << 4)) - 32
                    p = 128 * h + r
                    scale = d * np.float32(np.int8(scales[p // 16]))
                    out[k, 256 * b + p] = scale * np.float32(q)


# ----------------------------------------------------------------------------------------------
# the formats by their ggml type number
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BlockFormat:
    """One of ggml's tensor types: ``block`` weights stored in ``nbytes`` bytes, unpacked by ``rows``
    (None for F32, which is read as it is)."""

    name: str
    type_id: int
    block: int
    nbytes: int
    rows: object = None

    def row_bytes(self, n_cols: int) -> int:
        """Bytes of one row of ``n_cols`` weights."""
        return n_cols // self.block * self.nbytes


FORMATS = {f.type_id: f for f in (
    BlockFormat("F32", 0, 1, 4),
    BlockFormat("F16", 1, 1, 2, f16_rows),
    BlockFormat("Q4_0", 2, 32, 18, q4_0_rows),
    BlockFormat("Q4_1", 3, 32, 20, q4_1_rows),
    BlockFormat("Q8_0", 8, 32, 34, q8_0_rows),
    BlockFormat("Q4_K", 12, 256, 144, q4_k_rows),
    BlockFormat("Q6_K", 14, 256, 210, q6_k_rows),
)}

# ggml's other type numbers, to name them when a file holds one we don't unpack
OTHER_TYPES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 13: "Q5_K", 15: "Q8_K", 16: "IQ2_XXS",
               17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
               24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
               35: "TQ2_0", 39: "MXFP4"}


def format_of(type_id: int, tensor: str) -> BlockFormat:
    """The format of ggml type ``type_id``; a ValueError naming the tensor and the formats read here."""
    if type_id in FORMATS:
        return FORMATS[type_id]
    name = OTHER_TYPES.get(type_id, f"an unknown type (number {type_id})")
    readable = ", ".join(f.name for f in FORMATS.values())
    raise ValueError(f"Tensor {tensor!r} is stored as {name}, which this reader cannot unpack (it reads {readable}). "
                     f"Use a file quantised to one of those, e.g. re-quantise with llama.cpp's llama-quantize.")


def dequantize(raw: np.ndarray, fmt: BlockFormat, rows=None) -> np.ndarray:
    """Rows ``rows`` (an int array; all, in order, when None) of the packed tensor ``raw`` (its rows
    of bytes, ``(n_rows, row_bytes)``) as float32 ``(len(rows), n_cols)``."""
    rows = np.arange(raw.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= raw.shape[0]):     # the loops do not check
        raise ValueError(f"Row ids must lie in 0..{raw.shape[0] - 1}, got {rows.min()}..{rows.max()}.")
    n_cols = raw.shape[1] // fmt.nbytes * fmt.block
    out = np.empty((rows.shape[0], n_cols), dtype=np.float32)
    if fmt.rows is None:                                 # F32: the bytes are the floats
        out[...] = raw.view("<f4")[rows]
    else:
        fmt.rows(raw, rows, out)
    return out
