"""Numeric core of the attention dashboard: NumPy reference, Numba CPU and CUDA kernels.

Importing ``core`` prepares Numba before it is first imported:
- a writable on-disk cache for compiled kernels (``NUMBA_CACHE_DIR``), so a read-only install
  (a hosted demo) still compiles each kernel once, not once per process;
- a thread-safe threading layer, because Streamlit runs every session in its own thread and
  Numba's default ``workqueue`` layer aborts when two threads enter parallel code at once;
- cached kernels that recompile when a helper they are built from changes (``kernel_cache``);
- glibc's allocator set to reuse a layer's memory for the next layer (``allocator``).
"""
import os
import tempfile


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


def _choose_cache_dir() -> str | None:
    """Leave Numba's default (``__pycache__`` beside the sources) when that is writable."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    if _writable(os.path.join(os.path.dirname(__file__), "__pycache__")):
        return None
    home_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for candidate in (os.path.join(home_cache, "attention-lab", "numba"),
                      os.path.join(tempfile.gettempdir(), "attention-lab-numba")):
        if _writable(candidate):
            return candidate
    return None


_cache_dir = _choose_cache_dir()
if _cache_dir:
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir
# 'threadsafe' picks TBB or OpenMP, whichever is installed; never 'workqueue'. Set on the config
# too, in case Numba was imported (and read its environment) before this package.
os.environ.setdefault("NUMBA_THREADING_LAYER", "threadsafe")

import numba  # noqa: E402  (after the environment above is set)

numba.config.THREADING_LAYER = os.environ["NUMBA_THREADING_LAYER"]

# Cached kernels are stamped with the helpers they are built from, not only their own file.
from core import kernel_cache  # noqa: E402

kernel_cache.install()

# A forward pass's arrays are reused from layer to layer instead of faulted in again (numbers unchanged).
from core import allocator  # noqa: E402

allocator.keep_layer_memory()


# The public API's short names (``from core import encoder``, as the design promises users and their
# notebooks), for modules that live in core/lessons/, core/model/ and core/training/: imported on first
# use, not here, so that importing ``core`` stays cheap. ``core.training`` is a package of its own.
_PUBLIC_MODULES = {"analysis": "core.lessons.analysis", "decoder": "core.model.decoder",
                   "encoder": "core.model.tuned.classifier", "pretrained": "core.model.pretrained",
                   "tasks": "core.training.tasks"}


def __getattr__(name: str):
    if name in _PUBLIC_MODULES:
        import importlib

        return importlib.import_module(_PUBLIC_MODULES[name])
    raise AttributeError(f"module 'core' has no attribute {name!r}")
