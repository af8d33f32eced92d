"""Markers by folder: every test under tests/browser/ is a ``browser`` test, except the load test,
which is marked ``load``; so ``pytest -m "not browser and not load"`` runs everything else."""
from pathlib import Path

import pytest

BROWSER = Path(__file__).parent / "browser"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BROWSER in item.path.parents and item.get_closest_marker("load") is None:
            item.add_marker(pytest.mark.browser)
