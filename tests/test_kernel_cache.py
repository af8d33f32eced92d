"""core/kernel_cache.py: a cached kernel recompiles when a helper in another file changes."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core import kernel_cache

ROOT = Path(__file__).resolve().parents[1]
HELPER = "from numba import njit\n\n\n@njit(inline='always')\ndef value():\n    return 1\n"
KERNEL = ("from numba import njit\n\nfrom core.kernels.tuned.helper import value\n\n\n"
          "@njit(cache=True)\ndef kernel():\n    return value() + 10\n")


def test_the_stamped_locators_are_installed_first():
    assert kernel_cache.installed()
    from core.kernels.tuned import cpu
    assert type(cpu._fused_kernel[0]._cache._impl.locator).__name__.startswith("CoreSources")


@pytest.mark.compile
@pytest.mark.parametrize("cache_dir", [None, "cache"], ids=["beside the source", "NUMBA_CACHE_DIR"])
def test_editing_a_helper_alone_recompiles_the_kernel_built_from_it(tmp_path, cache_dir):
    """A package laid out as ours (``core/`` with its ``__init__``), a kernel in core/model/ that
    inlines a helper from core/kernels/tuned/: after the helper alone changes, a new process runs
    the new code, not the machine code cached before."""
    core = tmp_path / "core"
    (core / "kernels" / "tuned").mkdir(parents=True)
    (core / "model").mkdir()
    for name in ("__init__.py", "kernel_cache.py", "allocator.py"):     # what core/__init__ imports
        shutil.copy(ROOT / "core" / name, core / name)
    helper = core / "kernels" / "tuned" / "helper.py"
    helper.write_text(HELPER)
    (core / "model" / "kernel.py").write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(tmp_path), NUMBA_DEBUG_CACHE="1")
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = str(tmp_path / cache_dir)

    def run():
        result = subprocess.run([sys.executable, "-c", "from core.model.kernel import kernel; print(kernel())"],
                                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    assert run().endswith("11\n")
    second = run()
    assert "data loaded" in second and second.endswith("11\n")      # the cache is really used
    helper.write_text(HELPER.replace("return 1", "return 2"))
    assert run().endswith("12\n")
