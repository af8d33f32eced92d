"""The packaged model's weights checksum (core.model.minilm_package, core.model.packaged): checked before
every load, hashed again whenever the file has changed since it was last hashed, and not rehashed while
it has not; without the package, no network call unless downloads are allowed.

A small checkpoint stands in for the installed package, so these run without it."""
import hashlib
import os
import time
import types

import pytest

from core import pretrained
from core.model import config as C
from core.model import presets
from core.model import minilm_package
from core.model import packaged


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A tiny GPT-2 checkpoint where the package would be, published with its own sha256; returns
    the weights file's path."""
    cfg = presets.gpt2(vocab_size=13, n_ctx=8, d_model=8, n_heads=2, n_layers=1)
    folder = tmp_path / minilm_package.FOLDER
    pretrained.save(C.init_params(cfg, seed=0), cfg, str(folder))
    weights = folder / "model.safetensors"
    monkeypatch.setattr(minilm_package, "WEIGHTS_SHA256", hashlib.sha256(weights.read_bytes()).hexdigest())
    monkeypatch.setattr(minilm_package, "WEIGHTS_SIZE", weights.stat().st_size)
    dist = types.SimpleNamespace(locate_file=lambda path: tmp_path / path)
    monkeypatch.setattr(packaged.importlib.metadata, "distribution",
                        lambda name: dist if name == minilm_package.DISTRIBUTION else None)
    return str(weights)


@pytest.fixture
def hashes(monkeypatch):
    """Counts the files the checksum hashes: ``hashes.n``."""
    counter = types.SimpleNamespace(n=0)

    def sha256():
        counter.n += 1
        return hashlib.sha256()

    monkeypatch.setattr(packaged, "hashlib", types.SimpleNamespace(sha256=sha256))
    return counter


def _load():
    return pretrained.load(minilm_package.MINILM)


def _flip_a_byte(path, at=-5):
    """Change one byte in place: same file, same size, different bytes."""
    with open(path, "r+b") as f:
        f.seek(at, os.SEEK_END)
        b = f.read(1)
        f.seek(at, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def test_an_unchanged_file_is_hashed_once(installed, hashes):
    for _ in range(3):
        assert _load().config.vocab_size == 13
    assert hashes.n == 1


def test_a_file_changed_in_place_is_refused_at_the_next_load(installed, hashes):
    _load()
    before = os.stat(installed)
    _flip_a_byte(installed)
    os.utime(installed, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert os.path.getsize(installed) == before.st_size
    for _ in range(2):                                           # and at every load after it
        with pytest.raises(ValueError, match="damaged or not the published checkpoint"):
            _load()
    _flip_a_byte(installed)                                      # the published bytes again: loads
    assert _load().config.n_layers == 1


def test_a_change_that_keeps_the_size_and_modification_time_is_still_seen(installed):
    _load()
    before = os.stat(installed)
    # rewritten in place with its modification time put back (as a copy that keeps times does):
    # only the change time (ctime, which no one can set) tells
    while True:
        _flip_a_byte(installed, at=-7)
        os.utime(installed, ns=(before.st_atime_ns, before.st_mtime_ns))
        if os.stat(installed).st_ctime_ns != before.st_ctime_ns:
            break
        _flip_a_byte(installed, at=-7)                           # the clock has not ticked yet: again
        time.sleep(0.001)
    after = os.stat(installed)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    with pytest.raises(ValueError, match="damaged or not the published checkpoint"):
        _load()


def test_a_file_replaced_by_another_of_the_same_size_and_time_is_refused(installed):
    _load()
    before = os.stat(installed)
    other = installed + ".new"
    with open(installed, "rb") as f:
        data = bytearray(f.read())
    data[-3] ^= 0xFF
    with open(other, "wb") as f:
        f.write(data)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, installed)                                 # a new inode under the old name
    after = os.stat(installed)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(ValueError, match="damaged or not the published checkpoint"):
        _load()


def test_a_wrong_published_checksum_is_refused(installed, monkeypatch):
    monkeypatch.setattr(minilm_package, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="not the published 0000.*--force-reinstall"):
        _load()


def test_a_truncated_file_is_refused_by_its_size_without_hashing(installed, hashes):
    with open(installed, "r+b") as f:
        f.truncate(os.path.getsize(installed) - 1)
    with pytest.raises(ValueError, match="not the published .*damaged or not the published checkpoint.*--force-reinstall"):
        _load()
    assert hashes.n == 0


def test_without_the_package_no_download_unless_allowed(monkeypatch):
    fetched = []
    monkeypatch.setattr(minilm_package, "DISTRIBUTION", "no-such-package-here")
    monkeypatch.setattr(minilm_package.hub, "fetch_published",
                        lambda files, what, progress=None: fetched.append(files) or ["/hub/cache/config.json"])
    with pytest.raises(ValueError, match="not installed.*requirements-model.txt"):
        minilm_package.minilm_folder()
    assert fetched == []
    assert minilm_package.minilm_folder(allow_download=True) == "/hub/cache"
    names = [(f.repo, f.revision, f.filename) for f in fetched[0]]
    assert names == [(minilm_package.MINILM, minilm_package.REVISION, name)
                     for name in ("config.json", "model.safetensors", "tokenizer.json")]


def test_the_package_ships_the_published_files():
    """The Hub fetch checks config.json, model.safetensors and tokenizer.json against the sizes and sha256
    this module states: the installed package's files, the published ones, have exactly those."""
    import importlib.metadata

    try:
        importlib.metadata.distribution(minilm_package.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        if os.environ.get("REQUIRE_ORACLES") == "1":
            pytest.fail(f"{minilm_package.DISTRIBUTION} is not installed: {packaged.INSTALL}")
        pytest.skip(f"{minilm_package.DISTRIBUTION} is not installed ({packaged.INSTALL})")
    folder = minilm_package.minilm_folder()
    for published in minilm_package.published_files():
        path = os.path.join(folder, published.filename)
        assert (os.path.getsize(path), packaged.file_sha256(path)) == (published.size, published.sha256)
