"""Whether compiled code may run now, without waiting for a compile: the state the warm-up
(:mod:`core.warmup`, at the top of core) shares with every layer below it.

The readable sublayers in ``core/model`` ask :func:`can_run` before calling a compiled loop, and run
its NumPy formula while the loop is not loaded; the model pages ask :func:`ready` before training on a
compiled step. Both read one thing: which warm-up runs in this process. ``core.warmup`` registers
its warm-up here (:func:`register`), so the layers below it read the answer without importing it.

    running()                  # the process's warm-up while it runs, else None
    ready(label)               # its step ``label`` has loaded (or no warm-up runs here)
    can_run(kernel, *args)     # ``kernel``'s machine code for these argument types is loaded
"""
from __future__ import annotations

_started = None          # the process's warm-up (a core.warmup.WarmUp), once one was started


def register(warm) -> None:
    """Make ``warm`` the process's warm-up (``core.warmup.start_once`` does, once)."""
    global _started
    _started = warm


def started():
    """The process's warm-up, finished or not; None when none was started."""
    return _started


def running():
    """The process's warm-up while it runs, else None (never starts one)."""
    warm = _started
    return warm if warm is not None and not warm.finished else None


def ready(label: str) -> bool:
    """Whether a page may run step ``label``'s compiled code now without waiting for a compile: it
    has loaded, or no warm-up runs in this process (a script, a test: it compiles on first use)."""
    warm = running()
    return warm is None or warm.has_done(label)


def can_run(kernel, *args) -> bool:
    """Whether calling the Numba function ``kernel`` on ``args`` starts no compile on this thread:
    its machine code for these argument types is loaded, or no warm-up runs in this process."""
    if running() is None:
        return True
    from numba import typeof

    return tuple(typeof(a) for a in args) in kernel.overloads
