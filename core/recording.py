"""What ran: the record a page's source expander reads, so that it shows exactly the code behind the
page's numbers and no list of functions is kept by hand.

    with recording() as ran:
        out = model.forward(ids)          # every noted function that ran is appended to ``ran``, once

A function says it ran with :func:`note` (a choice made at run time, such as a compiled loop or
its NumPy twin) or is marked ``@recorded`` (a lesson function that always runs as written).
Nothing is recorded outside a ``with recording()`` block, and the record belongs to the thread
(or task) that opened it: two sessions of one server never see each other's.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

_ran: contextvars.ContextVar[list | None] = contextvars.ContextVar("ran", default=None)


@contextlib.contextmanager
def recording():
    """``with recording() as ran:`` each function noted inside the block is appended to ``ran`` once,
    in the order first run; a block nested in another fills both."""
    outer = _ran.get()
    ran: list = []
    token = _ran.set(ran)
    try:
        yield ran
    finally:
        _ran.reset(token)
        if outer is not None:
            for fn in ran:
                if fn not in outer:
                    outer.append(fn)


def note(fn) -> None:
    """Record ``fn`` as having run, inside :func:`recording`."""
    ran = _ran.get()
    if ran is not None and fn not in ran:
        ran.append(fn)


def recorded(fn):
    """Mark ``fn`` so that each call inside :func:`recording` notes it (the undecorated function is
    what is noted, so a page shows its source, not this wrapper's)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        note(fn)
        return fn(*args, **kwargs)

    return wrapper
