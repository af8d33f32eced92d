"""What ran: the record a page's source expander reads, so that it shows exactly the code behind the
page's numbers and no list of functions is kept by hand.

    with recording() as ran:
        m = induction.measure(params, cfg, data)    # @recorded: noted, with every function of core it runs
    ran.functions()                                 # each function that ran, once, in the order first run
    list(ran), ran.seconds                          # the kernel calls among them (core.kernels.dispatch)

Three ways into a record, each automatic:

- a function a page calls for its numbers is marked ``@recorded`` (where it cannot be marked, the
  page calls ``recorded(fn)(...)``). While it runs inside a recording, a profile hook on this thread
  (:func:`sys.setprofile`) notes every function of ``core`` it calls, the compiled ones included
  (Numba shows a profiler each call made from Python). What a compiled function calls inside Numba
  is out of sight: the page reads it from the compiled function's code (``dispatch.functions_of``).
- A choice made at run time (a compiled loop or its NumPy twin) calls :func:`note` with what it chose.
- A kernel driver (``core.kernels.dispatch.run``) adds its call: driver, kernels and seconds.

Nothing is recorded outside a ``with recording()`` block, and the record belongs to the thread
(or task) that opened it: two sessions of one server never see each other's.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import sys
import types

_ran: contextvars.ContextVar["Record | None"] = contextvars.ContextVar("ran", default=None)


class Record(list):
    """What ran inside one ``with recording()`` block: this list holds the kernel calls in order (each
    with ``seconds`` and the functions it ran, ``host + kernels``); :meth:`functions` every function
    that ran, once each, in the order first run, kernel calls' included."""

    def __init__(self, calls=()):
        super().__init__()
        self._functions: dict = {}     # a function's code -> the function (its Python source)
        self._builds: dict = {}        # the code of a compiled function that ran -> its compiled build
        for call in calls:
            self.add_call(call)

    @property
    def seconds(self) -> float:
        return sum(call.seconds for call in self)

    def functions(self) -> list:
        """Every function that ran, once each, in the order first run (a compiled one as its Python source)."""
        return list(self._functions.values())

    def build_of(self, fn):
        """The compiled build (a Numba dispatcher) behind ``fn`` when it was noted as compiled, else None."""
        return self._builds.get(_code_of(fn))

    def note(self, fn) -> None:
        """Add ``fn`` (a function, a bound method, a compiled function) unless it is here already."""
        fn = getattr(fn, "__func__", fn)                     # a bound method: its function
        if ".<locals>." in getattr(fn, "__qualname__", ""):  # a closure: the function whose source holds it
            fn = _function_of(fn.__code__, fn.__globals__) or fn
        source = getattr(fn, "py_func", fn)                  # a compiled function: its Python source
        key = _code_of(source)
        if key not in self._functions:
            self._functions[key] = source
        if source is not fn:
            self._builds.setdefault(key, fn)

    def add_call(self, call) -> None:
        """Add a kernel call, and note the functions it ran."""
        self.append(call)
        for fn in call.host + call.kernels:
            self.note(fn)

    def merge(self, other: "Record") -> None:
        """Add what ``other`` recorded (a cached computation's record, each time a page uses its result)."""
        list.extend(self, other)
        for fn in other.functions():
            self.note(other.build_of(fn) or fn)


def _code_of(fn) -> int:
    """The key of a function: its code object's identity (a code object's hash can change as the
    interpreter specialises it, so the object itself makes no dict key)."""
    return id(getattr(fn, "__code__", fn))


@contextlib.contextmanager
def recording(ran: Record | None = None):
    """``with recording() as ran:`` what runs inside the block is added to ``ran``; a block nested in
    another fills both. ``recording(ran)`` goes on filling an earlier block's record."""
    outer = _ran.get()
    ran = Record() if ran is None else ran
    token = _ran.set(ran)
    try:
        yield ran
    finally:
        _ran.reset(token)
        if outer is not None and outer is not ran:
            outer.merge(ran)


def current() -> Record | None:
    """The record of the innermost open ``with recording()`` block of this thread, else None."""
    return _ran.get()


def replay(record: Record) -> None:
    """Add an earlier record (a cached computation's, each time a page uses its result) to the
    recording open now, if any."""
    ran = _ran.get()
    if ran is not None and ran is not record:
        ran.merge(record)


def note(fn) -> None:
    """Record ``fn`` as having run, inside :func:`recording`."""
    ran = _ran.get()
    if ran is not None:
        ran.note(fn)


def recorded(fn):
    """Mark ``fn`` (or wrap it at a call site: ``recorded(fn)(...)``) so that a call inside
    :func:`recording` notes it and every function of ``core`` it runs. The undecorated function is
    what is noted, so a page shows its source, not this wrapper's."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ran = _ran.get()
        if ran is None:
            return fn(*args, **kwargs)
        ran.note(fn)
        if sys.getprofile() is not None:     # watched already (a recorded call inside another), or profiled
            return fn(*args, **kwargs)
        sys.setprofile(_watch)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(None)

    return wrapper


# --- watching the calls a recorded function makes ----------------------------------------------

_CORE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The machinery, not what a page computes: what records (and runs a training step to record it),
# what checks inputs (the one set of rules, core/validate.py, whose checks run compiled bit tricks;
# and every function named check_...), the bookkeeping of names and shapes (a model's config and its
# names), and what decides where and whether code runs. A kernel driver's call records itself
# (dispatch), a compiled loop's choice is noted (readiness).
UNWATCHED = frozenset(_CORE + name for name in (
    "recording.py", os.path.join("training", "step_record.py"), "validate.py", "readiness.py", "backend.py",
    "kernel_cache.py", "warmup.py", os.path.join("kernels", "dispatch.py"), os.path.join("model", "config.py"),
    os.path.join("model", "names.py")))
_found: dict = {}              # id(code) -> (code, the function noted for it or None), as _code_of keys


def _watch(frame, event, arg) -> None:
    """The profile hook: note the function of ``core`` that each call enters."""
    if event != "call":
        return
    code = frame.f_code
    found = _found.get(id(code))
    if found is None or found[0] is not code:          # new, or another code object since freed
        found = _found[id(code)] = (code, _function_of(code, frame.f_globals))
    fn = found[1]
    if fn is not None:
        note(fn)


def _function_of(code: types.CodeType, module_globals: dict):
    """The function of ``core`` whose code ``code`` is, found by its qualified name in its module; a
    function written inside another (a closure, a comprehension) stands for the one it is written in,
    whose source holds it. None for code outside core, the machinery above, or a module's own code."""
    file = os.path.abspath(code.co_filename)
    if not file.startswith(_CORE) or file in UNWATCHED:
        return None
    if "__name__" not in module_globals:               # a compiled function's frame (Numba's) has no globals
        module_globals = _globals_of_file(file)
    qualname = getattr(code, "co_qualname", code.co_name).split(".<locals>.")[0]
    if qualname.startswith("<") or qualname.rsplit(".", 1)[-1].lstrip("_").startswith("check"):
        return None                                    # <module>, a module-level lambda; an input check
    first, *rest = qualname.split(".")
    obj = module_globals.get(first)
    for name in rest:
        obj = inspect.getattr_static(obj, name, None)
        obj = getattr(obj, "__func__", obj)            # a staticmethod or classmethod: its function
    if obj is None or getattr(obj, "__module__", None) != module_globals.get("__name__"):
        return None
    while not hasattr(obj, "py_func") and hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__                          # @recorded, lru_cache: the function itself
    source = getattr(obj, "py_func", obj)              # (a compiled function stays itself: a build)
    return obj if isinstance(source, types.FunctionType) else None


def _globals_of_file(file: str) -> dict:
    """The namespace of the loaded module written in ``file`` (empty if none is)."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.abspath(path) == file:
            return vars(module)
    return {}
