"""Outside oracles (torch, transformers): optional on a laptop, required where CI says so.

``require("transformers")`` returns the module; when it is missing the test is skipped, unless the
environment sets ``REQUIRE_ORACLES=1`` (CI), where a missing oracle fails the test instead of
letting it pass unseen.
"""
import importlib
import os

import pytest


def require(module_name: str):
    """The imported module, or a skip (a failure under ``REQUIRE_ORACLES=1``) when it is missing."""
    if os.environ.get("REQUIRE_ORACLES") == "1":
        try:
            return importlib.import_module(module_name)
        except ImportError as err:
            pytest.fail(f"REQUIRE_ORACLES=1 but the oracle {module_name!r} cannot be imported: {err}")
    return pytest.importorskip(module_name)
