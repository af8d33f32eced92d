"""GGUF files for the reader's tests: the packaged SmolLM2 file, and a tiny Llama file written by
gguf-py's writer (:mod:`gguf_support`)."""
import os

import pytest

from gguf_support import random_llama_weights, write_llama_gguf


@pytest.fixture(scope="session")
def smollm2_file():
    """The installed SmolLM2 GGUF (checked against its sha256); skipped where it is not installed,
    except under ``REQUIRE_ORACLES=1`` (CI), where a missing package fails instead."""
    from core.model import smollm2_package

    try:
        return smollm2_package.smollm2_file()
    except ValueError as err:
        if os.environ.get("REQUIRE_ORACLES") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """``(path, weights)``: a tiny Llama GGUF (Q4_1 weights, a Q8_0 embedding, tied) and the float32
    weights it was quantised from, by transformers' names."""
    weights = random_llama_weights(seed=1)
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return write_llama_gguf(path, weights), weights
