"""Reading a GGUF file (llama.cpp's single-file checkpoint): its header, metadata and tensor table,
and its tensors' bytes in place, through a memory map.

The layout (versions 2 and 3; little-endian; every count and length 64-bit)::

    magic "GGUF", version (u32), tensor count (u64), metadata count (u64)
    metadata:  key (string), value type (u32), value          a string is a u64 length, then UTF-8
    tensors:   name (string), n_dims (u32), dims (u64 each, the fastest-moving first),
               ggml type (u32), offset (u64, from the start of the data)
    padding to ``general.alignment`` (32 unless the metadata says), then the data

A 2-D tensor's dims are ``(ne0, ne1)``: ``ne1`` rows of ``ne0`` numbers each, so NumPy's shape is
``(ne1, ne0)``, which is torch's ``(out, in)`` for a linear layer's weight. Nothing is copied: a
tensor's bytes are a view of the memory map, read from disk when first touched.
"""
from __future__ import annotations

import dataclasses
import math
import os
import struct

import numpy as np

from core.model.gguf.quants import BlockFormat, format_of

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# metadata value types: number -> (struct format, NumPy dtype); 8 is a string, 9 an array
SCALARS = {0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
           5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
           12: ("<d", "<f8")}
STRING, ARRAY = 8, 9


class _Truncated(Exception):
    """A read ran past the end of the file."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of the table: its ``shape`` in NumPy's order (rows first), its format, and where
    its bytes lie in the file (``start``, ``nbytes``)."""

    name: str
    shape: tuple[int, ...]
    format: BlockFormat
    start: int
    nbytes: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFFile:
    """A GGUF file opened for reading: ``metadata`` (key -> value: int, float, bool, str, or a list
    or NumPy array for an array value) and ``tensors`` (name -> :class:`TensorInfo`), in file order."""

    path: str
    version: int
    metadata: dict
    tensors: dict
    alignment: int
    data_start: int
    mapped: np.ndarray = dataclasses.field(repr=False)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, a read-only view of the file: ``(rows, row_bytes)`` uint8, each row
        the packed blocks of one row of the tensor (a 1-D tensor is one row)."""
        info = self.tensors[name]
        rows = math.prod(info.shape[:-1])
        return self.mapped[info.start:info.start + info.nbytes].reshape(rows, info.nbytes // rows)

    def floats(self, name: str) -> np.ndarray:
        """An F32 tensor as a read-only float32 view of the file, of its NumPy shape."""
        info = self.tensors[name]
        if info.format.name != "F32":
            raise ValueError(f"Tensor {name!r} is stored as {info.format.name}, not F32.")
        return self.raw(name).view("<f4").reshape(info.shape)


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------
class _Cursor:
    """Reads the header's little-endian fields in order from the mapped bytes."""

    def __init__(self, mapped: np.ndarray):
        self.buf, self.pos = memoryview(mapped), 0         # a memoryview: struct reads it fastest

    def take(self, n: int) -> int:
        """Move past ``n`` bytes; their offset."""
        if n < 0 or self.pos + n > len(self.buf):
            raise _Truncated
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        try:
            return str(self.buf[start:start + n], "utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"a string at byte {start} is not UTF-8") from None

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row: :meth:`string` in one loop, with no call per string."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        unpack_length = struct.Struct("<Q").unpack_from
        try:
            for _ in range(count):
                if pos + 8 > end:
                    raise _Truncated
                n = unpack_length(buf, pos)[0]
                if pos + 8 + n > end:
                    raise _Truncated
                out.append(str(buf[pos + 8:pos + 8 + n], "utf-8"))
                pos += 8 + n
        except UnicodeDecodeError:
            raise ValueError(f"a string at byte {pos + 8} is not UTF-8") from None
        self.pos = pos
        return out

    def value(self, kind: int):
        """One metadata value of type ``kind``."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind][0])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in SCALARS:                          # numbers: one array, copied out of the map
                dtype = np.dtype(SCALARS[item][1])
                start = self.take(count * dtype.itemsize)
                return np.frombuffer(self.buf, dtype, count, start).copy()
            if count > len(self.buf) - self.pos:     # each item takes a byte at least
                raise _Truncated
            if item == STRING:                           # a vocabulary: 50,000 strings and more
                return self.strings(count)
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"a metadata value has type number {kind}, which GGUF does not define")


def open_gguf(path: str) -> GGUFFile:
    """The GGUF file at ``path``, its header and tables read and its data mapped (not read); a
    ValueError that says what is wrong when it is not a GGUF file, is cut short, or holds a tensor
    in a format this reader cannot unpack."""
    path = os.fspath(path)
    try:
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as err:                 # a missing file, or an empty one (nothing to map)
        raise ValueError(f"{path} cannot be read as a GGUF file: {err}") from None
    if bytes(mapped[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'). Give a .gguf "
                         f"checkpoint as llama.cpp writes it.")
    try:
        return _read(path, mapped)
    except _Truncated:
        raise ValueError(f"{path} ends before its header and tensors do ({mapped.shape[0]:,} bytes): the file "
                         f"is truncated (an interrupted download or copy?). Fetch or copy it again.") from None
    except ValueError as err:
        raise ValueError(f"{path} is not a readable GGUF file: {err}") from None


def _read(path: str, mapped: np.ndarray) -> GGUFFile:
    cur = _Cursor(mapped)
    cur.take(4)                                          # the magic
    version = cur.scalar("<I")
    if version not in VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
            raise ValueError("it is a big-endian GGUF; only little-endian files (the usual kind) are read")
        raise ValueError(f"it is GGUF version {version}; versions {VERSIONS[0]} and {VERSIONS[1]} are read "
                         f"(convert an old file with a current llama.cpp)")
    n_tensors, n_values = cur.scalar("<Q"), cur.scalar("<Q")

    metadata = {}
    for _ in range(n_values):
        key = cur.string()
        if key in metadata:
            raise ValueError(f"the metadata key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar("<I"))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {alignment!r}, not a power of two")

    table = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        dims = [cur.scalar("<Q") for _ in range(n_dims)]           # fastest-moving first
        type_id, offset = cur.scalar("<I"), cur.scalar("<Q")
        table.append((name, tuple(reversed(dims)), type_id, offset))
    data_start = -(-cur.pos // alignment) * alignment              # the next multiple of the alignment

    tensors = {}
    for name, shape, type_id, offset in table:
        fmt = format_of(type_id, name)
        if not shape or shape[-1] % fmt.block:
            raise ValueError(f"tensor {name!r} has shape {shape}; its rows must be whole {fmt.name} blocks "
                             f"of {fmt.block}")
        if offset % alignment:
            raise ValueError(f"tensor {name!r} starts at offset {offset}, not a multiple of {alignment}")
        nbytes = math.prod(shape[:-1]) * fmt.row_bytes(shape[-1])
        if data_start + offset + nbytes > mapped.shape[0]:
            raise _Truncated
        if name in tensors:
            raise ValueError(f"tensor {name!r} appears twice")
        tensors[name] = TensorInfo(name, shape, fmt, data_start + offset, nbytes)
    return GGUFFile(path, version, metadata, tensors, alignment, data_start, mapped)
