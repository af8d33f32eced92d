"""Which backend runs the kernels (``cpu`` or ``cuda``), why, and how to describe it.

Which kernels of that backend run a call (the lesson ones or the tuned ones) is decided in
``core/kernels/dispatch.py``.

``backend=None`` everywhere means: the ``ATTN_BACKEND`` environment variable (``cpu``, ``cuda``,
``auto``), else auto: CUDA when a real GPU is present, else CPU. The CUDA simulator is never
mistaken for a GPU, and asking for ``cuda`` without one is an error, not a silent fallback.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

CHOICES = ("auto", "cpu", "cuda")


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator stands in for a GPU (``NUMBA_ENABLE_CUDASIM=1``)."""
    import numba

    return bool(numba.config.ENABLE_CUDASIM)


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True only for a real CUDA device with a working driver (the simulator does not count)."""
    if simulator_enabled() or _no_driver_library():
        return False
    try:
        from numba import cuda

        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # no driver, no toolkit, broken install: all mean "no GPU here"
        return False


def _no_driver_library() -> bool:
    """True when no CUDA driver library loads, found in a millisecond: importing ``numba.cuda``
    to ask takes a third of a second, paid by every page's first run on a machine without a GPU.
    Looks where Numba looks on Linux; elsewhere, or with ``NUMBA_CUDA_DRIVER`` set, Numba decides."""
    if sys.platform != "linux" or os.environ.get("NUMBA_CUDA_DRIVER"):
        return False
    names = ("libcuda.so", "libcuda.so.1")
    for path in names + tuple(os.path.join(folder, name) for folder in ("/usr/lib", "/usr/lib64") for name in names):
        try:
            ctypes.CDLL(path)
            return False
        except OSError:
            continue
    return True


def cuda_usable() -> bool:
    """The CUDA kernels can run: on a real GPU, or on the simulator (tests, teaching)."""
    return gpu_present() or simulator_enabled()


_env_choice = os.environ.get("ATTN_BACKEND")


def refresh() -> None:
    """Re-read ``ATTN_BACKEND`` and look for a GPU again (both are read once, as calls are hot)."""
    global _env_choice
    _env_choice = os.environ.get("ATTN_BACKEND")
    gpu_present.cache_clear()


def resolve(name: str | None = None) -> str:
    """Return ``"cpu"`` or ``"cuda"`` for a requested backend name.

    ``name`` wins, then ``ATTN_BACKEND`` (as read at import or by :func:`refresh`), then
    auto-detection.
    """
    requested = name or _env_choice or "auto"
    if requested == "cpu":           # the common case, answered before any string work (every call asks)
        return "cpu"
    requested = requested.strip().lower()
    if requested not in CHOICES:
        raise ValueError(f"Unknown backend {requested!r}: choose one of {', '.join(CHOICES)}.")
    if requested == "auto":
        return "cuda" if gpu_present() else "cpu"
    if requested == "cuda" and not cuda_usable():
        raise ValueError(
            "The CUDA backend was asked for, but no CUDA GPU is available on this machine "
            "(set ATTN_BACKEND=cpu, or NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in the simulator)."
        )
    return requested


def describe(name: str | None = None) -> str:
    """A one-line, human description of what runs, e.g. ``"CPU (Numba JIT, 2 threads)"``."""
    import numba

    try:
        chosen = resolve(name)
    except ValueError as err:
        return f"unavailable: {err}"
    if chosen == "cpu":
        return f"CPU (Numba JIT, {numba.get_num_threads()} threads)"
    if simulator_enabled():
        return "CUDA simulator (Numba, runs on the CPU; for testing only)"
    from numba import cuda

    dev = cuda.get_current_device()
    name_ = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    cc = ".".join(map(str, dev.compute_capability))
    return f"CUDA GPU {name_} (compute capability {cc}, Numba CUDA)"
