"""The outside oracles (PyTorch, transformers): skipped where they are not installed, except in CI.

``.ci/run`` installs them from ``requirements-oracle.txt`` and sets ``REQUIRE_ORACLES=1``; there a
missing oracle fails the test instead of skipping it, so no comparison silently drops out.
"""
import importlib
import os

import pytest


def require(module_name):
    """The module, imported; a skip where it is missing, or a failure under ``REQUIRE_ORACLES=1``."""
    if os.environ.get("REQUIRE_ORACLES") == "1":
        return importlib.import_module(module_name)
    return pytest.importorskip(module_name, reason=f"{module_name} is not installed: the comparison is skipped")
