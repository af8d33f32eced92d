"""The GGUF reader: every metadata value type, the tensor table and the data's place against gguf-py's
reader, tensors read in place, and a clear ValueError for a file it cannot read."""
import struct

import numpy as np
import pytest

from core.model.gguf.file import open_gguf
from oracle_support import require


def write(path, values: dict, tensors=(), alignment=None, version=None) -> str:
    """A GGUF written by gguf-py: ``values`` key -> (value, GGUFValueType[, item type]);
    ``tensors`` (name, array) pairs."""
    gguf = require("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, (value, kind, *item) in values.items():
        writer.add_key_value(key, value, kind, sub_type=item[0] if item else None)
    for name, array in tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if version is not None:                              # gguf-py writes v3; v2 has the same layout
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))
    return str(path)


def test_every_value_type_and_arrays_read_back(tmp_path):
    T = require("gguf").GGUFValueType
    values = {"u8": (200, T.UINT8), "i8": (-100, T.INT8), "u16": (60000, T.UINT16), "i16": (-30000, T.INT16),
              "u32": (4_000_000_000, T.UINT32), "i32": (-2_000_000_000, T.INT32), "f32": (0.1, T.FLOAT32),
              "bool": (True, T.BOOL), "text": ("naïve 🙂", T.STRING), "u64": (2**63 + 5, T.UINT64),
              "i64": (-(2**62), T.INT64), "f64": (0.1, T.FLOAT64),
              "ints": ([1, -2, 3], T.ARRAY, T.INT32), "floats": ([0.5, 1.25], T.ARRAY, T.FLOAT32),
              "words": (["a", "", "ü"], T.ARRAY, T.STRING), "flags": ([True, False], T.ARRAY, T.BOOL),
              "nested": ([["x", "y"], ["z"]], T.ARRAY, T.ARRAY)}
    for version in (2, 3):
        meta = open_gguf(write(tmp_path / f"v{version}.gguf", values, version=version)).metadata
        assert meta["general.architecture"] == "llama"
        assert meta["u8"] == 200 and meta["i8"] == -100 and meta["u16"] == 60000 and meta["i16"] == -30000
        assert meta["u32"] == 4_000_000_000 and meta["i32"] == -2_000_000_000 and meta["u64"] == 2**63 + 5
        assert meta["i64"] == -(2**62) and meta["f32"] == float(np.float32(0.1)) and meta["f64"] == 0.1
        assert meta["bool"] is True and meta["text"] == "naïve 🙂"
        assert meta["ints"].tolist() == [1, -2, 3] and meta["ints"].dtype == np.int32
        assert meta["floats"].tolist() == [0.5, 1.25] and meta["flags"].tolist() == [True, False]
        assert meta["words"] == ["a", "", "ü"] and meta["nested"] == [["x", "y"], ["z"]]


def test_the_packaged_file_reads_as_gguf_py_reads_it(smollm2_file):
    gguf = require("gguf")
    theirs = gguf.GGUFReader(smollm2_file)
    ours = open_gguf(smollm2_file)
    assert ours.version == 3 and ours.alignment == 32 and ours.data_start == theirs.data_offset
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.metadata[key]
        expected = field.contents()
        assert (np.asarray(value).tolist() if isinstance(value, np.ndarray) else value) == expected, key
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(reversed(t.shape.tolist())) and info.format.name == t.tensor_type.name
        assert (info.start, info.nbytes) == (t.data_offset, t.n_bytes)
        assert np.array_equal(ours.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    assert sum(info.size for info in ours.tensors.values()) == 134_515_008


def test_tensors_are_read_in_place_from_the_memory_map(tmp_path):
    w = np.arange(96, dtype=np.float32).reshape(3, 32)
    path = write(tmp_path / "t.gguf", {}, [("w", w), ("v", np.ones(5, np.float32))], alignment=64)
    f = open_gguf(path)
    assert f.alignment == 64 and f.data_start % 64 == 0 and f.tensors["v"].start % 64 == 0
    view = f.floats("w")
    assert np.array_equal(view, w) and np.shares_memory(view, f.mapped) and not view.flags.writeable
    assert np.array_equal(f.floats("v"), np.ones(5))


# ----------------------------------------------------------------------------------------------
# files the reader refuses
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def small_file(tmp_path):
    T = require("gguf").GGUFValueType
    return write(tmp_path / "small.gguf", {"words": (["a", "b"], T.ARRAY, T.STRING)},
                 [("w", np.ones((2, 32), np.float32))])


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        open_gguf(path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot be read as a GGUF file"):
        open_gguf(tmp_path / "empty.gguf")


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.97])
def test_a_truncated_file_is_refused(small_file, tmp_path, keep):
    data = open(small_file, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])          # inside the metadata, the table, the data
    with pytest.raises(ValueError, match="truncated"):
        open_gguf(cut)


def test_another_version_or_byte_order_is_refused(small_file, tmp_path):
    data = bytearray(open(small_file, "rb").read())
    for version, message in ((struct.pack("<I", 1), "version 1"), (struct.pack(">I", 3), "big-endian")):
        data[4:8] = version
        (tmp_path / "v.gguf").write_bytes(data)
        with pytest.raises(ValueError, match=message):
            open_gguf(tmp_path / "v.gguf")


def test_an_unknown_tensor_type_is_refused(small_file, tmp_path):
    data = bytearray(open(small_file, "rb").read())
    at = data.index(b"\x01\x00\x00\x00\x00\x00\x00\x00w") + 9      # the tensor's name, then its table entry
    n_dims = struct.unpack_from("<I", data, at)[0]
    data[at + 4 + 8 * n_dims:at + 8 + 8 * n_dims] = struct.pack("<I", 13)     # F32 -> Q5_K
    (tmp_path / "q5k.gguf").write_bytes(data)
    with pytest.raises(ValueError, match="'w' is stored as Q5_K, which this reader cannot unpack"):
        open_gguf(tmp_path / "q5k.gguf")
