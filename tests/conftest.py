"""Markers by folder: every test under tests/browser/ is a ``browser`` test, except the load test,
which is marked ``load``; so ``pytest -m "not browser and not load"`` runs everything else."""
import os
from pathlib import Path

import pytest

BROWSER = Path(__file__).parent / "browser"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BROWSER in item.path.parents and item.get_closest_marker("load") is None:
            item.add_marker(pytest.mark.browser)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernel drivers a page or a function calls, in order (every kernel call goes through dispatch.run)."""
    from core.kernels import dispatch

    calls = []
    run_kernels = dispatch.run

    def counted(backend, work, operation, *args):
        calls.append(operation)
        return run_kernels(backend, work, operation, *args)

    monkeypatch.setattr(dispatch, "run", counted)
    return calls


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 from its installed package; skipped where it is not installed, except under
    ``REQUIRE_ORACLES=1`` (CI), where a missing package fails instead."""
    import importlib.metadata

    import numpy as np

    from core import pretrained
    from core.model import minilm_package

    try:
        importlib.metadata.distribution(minilm_package.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        if os.environ.get("REQUIRE_ORACLES") == "1":
            pytest.fail(f"{minilm_package.DISTRIBUTION} is not installed: {minilm_package.INSTALL}")
        pytest.skip(f"{minilm_package.DISTRIBUTION} is not installed ({minilm_package.INSTALL})")
    return pretrained.load(minilm_package.MINILM, np.float32)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A random GPT-2 saved by transformers itself (safetensors, ``transformer.`` keys), and the model."""
    from oracle_support import TINY_GPT2, random_gpt2

    model = random_gpt2(TINY_GPT2, seed=3)
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder), model
