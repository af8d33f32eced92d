"""Markers by folder: every test under tests/browser/ is a ``browser`` test, except the load test,
which is marked ``load``; so ``pytest -m "not browser and not load"`` runs everything else."""
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
