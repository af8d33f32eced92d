"""Keep the on-disk cache of compiled kernels honest about what the kernels are made of.

Numba (``cache=True``) stamps a cached function with the text of its own source file only. Our
kernels are built from helpers in other files: the tuned attention kernels inline ``tiles.py``,
``simd.py`` and ``fastexp.py``, and the compiled model steps call one another across files. Numba
copies that code into each kernel's cached machine code, so after an edit to a helper alone (or an
update that changes only a helper) it would go on loading the old code.

Here a kernel under ``core/`` is stamped with its own file and with every source file of its folder
and of ``core/kernels/tuned/`` (the helpers all folders share): editing any of them recompiles the
kernels that may have used it, once.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache

from numba.core import caching

_CORE = os.path.dirname(os.path.abspath(__file__))
_SHARED = os.path.join(_CORE, "kernels", "tuned")


@lru_cache(maxsize=None)
def _digest(folder: str, listing: tuple) -> bytes:
    """The SHA-256 of a folder's Python sources; ``listing`` (names, sizes and modification
    times) is the memo key, so an edit while the process runs is seen too."""
    h = hashlib.sha256()
    for name, _, _ in listing:
        with open(os.path.join(folder, name), "rb") as source:
            h.update(name.encode() + b"\0" + source.read())
    return h.digest()


def folder_digest(folder: str) -> bytes:
    listing = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.endswith(".py") and entry.is_file():
            stat = entry.stat()
            listing.append((entry.name, stat.st_size, stat.st_mtime_ns))
    return _digest(folder, tuple(listing))


def sources_stamp(py_file: str) -> tuple:
    """What a kernel in ``py_file`` is made of: its folder's sources and the shared helpers'."""
    folders = sorted({os.path.dirname(os.path.abspath(py_file)), _SHARED})
    return tuple(folder_digest(folder) for folder in folders)


def _in_core(py_file: str) -> bool:
    return os.path.abspath(py_file).startswith(_CORE + os.sep)


def _stamped(locator_class):
    """``locator_class`` for files under ``core/``, with :func:`sources_stamp` in its stamp."""

    class Stamped(locator_class):
        def get_source_stamp(self):
            return super().get_source_stamp(), sources_stamp(self._py_file)

        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _in_core(py_file) else None

    Stamped.__name__ = Stamped.__qualname__ = "CoreSources" + locator_class.__name__.lstrip("_")
    return Stamped


def _numba(name):
    """A class of Numba's caching module: public names since Numba 0.68, a leading underscore before."""
    return getattr(caching, name, None) or getattr(caching, "_" + name)


# Numba's own locators for a user-given NUMBA_CACHE_DIR and for __pycache__ beside the source.
_LOCATORS = [_stamped(_numba("UserProvidedCacheLocator")), _stamped(_numba("InTreeCacheLocator"))]


def install() -> None:
    """Put the stamped locators first in Numba's list (once). Done by ``import core``, before any
    kernel is defined."""
    classes = _numba("CacheImpl")._locator_classes
    if classes[:len(_LOCATORS)] != _LOCATORS:
        classes[:0] = _LOCATORS


def installed() -> bool:
    return _numba("CacheImpl")._locator_classes[:len(_LOCATORS)] == _LOCATORS
