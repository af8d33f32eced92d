"""Which kernels run a call, and a record of the functions that ran.

Three kernel modules share one host-driver interface (see ``core/kernels/__init__.py``):

- ``core.kernels.cpu``: the lesson kernels, one readable loop nest per operation;
- ``core.kernels.tuned.cpu``: the same operations as register-tiled SIMD kernels, for all but the
  smallest inputs from code (the lesson pages keep the lesson kernels: see :func:`lesson_recording`);
- ``core.kernels.gpu``: the lesson kernels for CUDA.

:func:`kernels_for` picks one for a call; :func:`run` calls a driver of the one picked. Inside
``with recording() as ran:`` (:mod:`core.recording`, the one record a page keeps), every call also
leaves behind what ran (the host driver, the kernels it launched, the module, the seconds it took),
so a page can show exactly the code behind its numbers; :func:`functions_behind` reads the
compiled functions a record's compiled functions call from their code. The record lives in a
context variable: each thread (each Streamlit session runs in its own) sees only its own calls.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import time
import types
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from core import backend as _backend
from core.recording import Record, current, recording  # noqa: F401  (recording: the one record, re-exported)
from core.kernels.warm_inputs import tiny_inputs

LESSON_CPU, TUNED_CPU, LESSON_GPU = "core.kernels.cpu", "core.kernels.tuned.cpu", "core.kernels.gpu"

# Work counts multiply-adds: B*H*Tq*Tk*(d_k + d_v) for attention, B*T*d_in*d_out for a
# projection, T*d_model for positions (see core/attention.py). A call from code runs the tuned
# kernels from the work at which they were measured faster than the lesson ones, per operation:
# `python -m bench crossover` (float32, this machine: AVX2 EPYC, 2 cores; both runs in
# bench/RESULTS.md), the larger of two runs' crossovers. Below it, the lesson kernels' shorter
# setup wins (H=4, d=4: T <= 8). The tuned projection never won in time measured, nor the
# tuned sinusoid in its serial build: NEVER. Keeping the scores on the way to the weights is the
# weights' kernel with one copy per row more: their crossover.
NEVER = 1 << 62
TUNED_FROM = {
    "attention_with_weights": 8_192, "attention_with_scores": 8_192, "fused_attention": 8_192,
    "scaled_scores": 9_216, "weighted_sum": 9_216, "merge_heads_project": 4_096, "project_heads": NEVER,
    "sinusoidal": NEVER,
}
# Lesson pages keep the lesson kernels whatever the size: they show those kernels' source (see
# lesson_recording). TRACK_ENV forces one track for a whole process; track() for a block of code.
TRACK_ENV = "ATTN_KERNELS"
TRACKS = ("auto", "lesson", "tuned")
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("kernel_track", default=None)


def _read_track_env() -> str:
    return os.environ.get(TRACK_ENV, "").strip().lower() or "auto"


# Read at import and by refresh(), as core.backend reads ATTN_BACKEND: looking up an unset
# variable in os.environ raises and catches a KeyError, 1.5 us of a lesson-size call's 20.
_env_track = _read_track_env()


def refresh() -> None:
    """Re-read ``ATTN_KERNELS`` (read once, at import: calls are hot)."""
    global _env_track
    _env_track = _read_track_env()


@contextlib.contextmanager
def track(name: str) -> Iterator[None]:
    """``with track("lesson"):`` (or ``"tuned"``, ``"auto"``) runs every CPU call of this thread
    inside the block on that track, whatever its size and whatever ``ATTN_KERNELS`` says."""
    if name not in TRACKS:
        raise ValueError(f"Unknown kernel track {name!r}; choose one of {', '.join(TRACKS)}.")
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


def chosen_track() -> str:
    """``"auto"``, ``"lesson"`` or ``"tuned"``: the innermost :func:`track` block, else the
    ``ATTN_KERNELS`` environment variable (as read at import or by :func:`refresh`), else auto."""
    name = _forced.get() or _env_track
    if name not in TRACKS:
        raise ValueError(f"{TRACK_ENV}={name!r} is not a kernel track; use one of {', '.join(TRACKS)}.")
    return name


def kernels_for(backend: str | None, work: int, operation: str = "attention_with_weights") -> types.ModuleType:
    """The kernel module for one call: on CUDA the lesson GPU kernels (one thread per entry, or
    per query with shared key tiles: readable and fast at once); on the CPU the track forced by
    :func:`track` or ``ATTN_KERNELS``, else the lesson kernels below ``TUNED_FROM[operation]``
    multiply-adds and the tuned ones from there on."""
    if _backend.resolve(backend) == "cuda":
        return _module(LESSON_GPU)
    name = chosen_track()
    if name == "auto":
        name = "lesson" if work < TUNED_FROM[operation] else "tuned"
    return _module(LESSON_CPU if name == "lesson" else TUNED_CPU)


_imported: dict[str, types.ModuleType] = {}


def _module(name: str) -> types.ModuleType:
    """Imported on first use: a lesson page never imports (or compiles) the tuned kernels."""
    module = _imported.get(name)
    if module is None:
        module = _imported[name] = importlib.import_module(name)
    return module


# --- the record of what ran --------------------------------------------------------------------
# One record for the whole page (core.recording.Record): the kernel calls below, with their seconds,
# and every other function that ran. recording is re-exported here for code that times kernels.


@dataclass(frozen=True)
class KernelCall:
    """One call of a host driver: what ran, where, and how long it took."""

    operation: str                       # the driver's name, e.g. "attention_with_weights"
    module: str                          # e.g. "core.kernels.cpu"
    track: str                           # "lesson" or "tuned"
    device: str                          # "cpu" or "cuda"
    host: tuple[Callable, ...]           # the driver, then the host functions it calls
    kernels: tuple[Callable, ...]        # the compiled functions it launches, as Python source
    seconds: float


@contextlib.contextmanager
def lesson_recording(ran: Record | None = None) -> Iterator[Record]:
    """:func:`recording` on the lesson track: what the lesson pages wrap their computation in, so
    the source they show is the readable kernels' at every size a page allows (``ran``: go on
    filling an earlier block's record)."""
    with track("lesson"), recording(ran) as ran:
        yield ran


def run(backend: str | None, work: int, operation: str, *args):
    """``operation(*args)`` on the kernels :func:`kernels_for` picks for ``backend`` and ``work``;
    inside :func:`recording`, also notes what ran and how long it took."""
    kernels = kernels_for(backend, work, operation)
    driver = getattr(kernels, operation)
    ran = current()
    if ran is None:
        return driver(*args)
    start = time.perf_counter()
    result = driver(*args)
    seconds = time.perf_counter() - start
    host, launched = functions_of(driver)
    name = kernels.__name__
    ran.add_call(KernelCall(operation, name, "tuned" if name == TUNED_CPU else "lesson",
                            "cuda" if name == LESSON_GPU else "cpu", host, launched, seconds))
    return result


@functools.lru_cache(maxsize=None)
def functions_of(driver: Callable) -> tuple[tuple[Callable, ...], tuple[Callable, ...]]:
    """``(host, kernels)``: the Python functions a host driver (or a compiled function) runs, read
    from its code.

    Every global name the code uses is looked up where the code was written: a function of the
    driver's own module is host code (another driver, a helper); a compiled function (``@njit``,
    ``@cuda.jit``, a pair of builds, a cached kernel factory) is a kernel. Each is followed into
    its own code, so helpers a kernel calls are found too. Kernels appear as their Python source
    function (``py_func``); builds of one source appear once. A compiled function has no host code:
    ``((), (its source, the compiled functions it calls...))``.
    """
    host: dict = {}       # id(code) -> function: a code object's hash may change as it is specialised
    kernels: dict = {}

    def visit(fn, is_kernel: bool) -> None:
        found = kernels if is_kernel else host
        if id(fn.__code__) in host or id(fn.__code__) in kernels:
            return
        found[id(fn.__code__)] = fn
        for name in _global_names(fn.__code__):
            obj = fn.__globals__.get(name)
            for item in obj if isinstance(obj, tuple) else (obj,):
                source = _kernel_source(item)
                if source is not None:
                    visit(source, True)
                elif (not is_kernel and isinstance(item, types.FunctionType)
                      and item.__module__ == driver.__module__):
                    visit(item, False)

    compiled = _kernel_source(driver)
    visit(driver if compiled is None else compiled, compiled is not None)
    return tuple(host.values()), tuple(kernels.values())


def functions_behind(ran: Record) -> list[Callable]:
    """Every function behind a record's numbers, each once, in the order first run: the functions
    that ran, each compiled one followed by the compiled functions it calls (inside Numba nothing
    can note itself: they are read from its code by :func:`functions_of`). What a page's source
    expander shows."""
    shown: dict = {}
    for fn in ran.functions():
        build = ran.build_of(fn)
        for each in (fn,) if build is None else functions_of(build)[1]:
            shown.setdefault(id(each.__code__), each)
    return list(shown.values())


def _global_names(code: types.CodeType) -> list[str]:
    """The global (and attribute) names a code object uses, nested functions' included."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def _kernel_source(obj) -> types.FunctionType | None:
    """The Python function a compiled kernel was built from (None for anything else)."""
    if isinstance(getattr(obj, "py_func", None), types.FunctionType):      # @njit, @cuda.jit
        return obj.py_func
    if isinstance(getattr(obj, "__wrapped__", None), types.FunctionType):  # a cached kernel factory
        return obj.__wrapped__
    return None


# --- compiling ahead of a page ---------------------------------------------------------------


def _tiny_inputs(operation: str, dtype) -> tuple:
    """Arguments of the smallest call of a driver (the types every later call has)."""
    X4, X3, W, b, mask = tiny_inputs(dtype)
    return {"scaled_scores": (X4, X4, mask, 1.0), "attention_with_weights": (X4, X4, X4, mask, 1.0),
            "attention_with_scores": (X4, X4, X4, mask, 1.0),
            "fused_attention": (X4, X4, X4, mask, 1.0), "weighted_sum": (X4, X4),
            "project_heads": (X3, W, b, 1), "merge_heads_project": (X4, W, b),
            "sinusoidal": (2, 2, 10000.0, np.dtype(dtype))}[operation]


def warm_up(backend: str | None, dtype, operations) -> None:
    """Compile (or load from the disk cache) the kernels of ``operations`` that inputs of a lesson
    page's size run (the lesson kernels), for one dtype; nothing else."""
    with track("lesson"):
        kernels = kernels_for(backend, 0)
    for operation in operations:
        getattr(kernels, operation)(*_tiny_inputs(operation, dtype))
