"""Reading a page's source expander, and what the model's forward pass records, for the page tests
that check an expander lists exactly the functions that ran."""
from __future__ import annotations

import types

import numpy as np

from core.kernels import dispatch
from core.model import activations, layers, multi_head
from core.model.tuned import forward as tuned_forward
from core.recording import recorded, recording
from ui.widgets import SOURCES_KEY


def full_name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def source_names(at, start: str, key: str = SOURCES_KEY) -> list[str]:
    """The functions the one expander whose label starts with ``start`` names, in order."""
    return [m.value.split("`")[1] for m in opened_source(at, start, key).markdown if m.value.startswith("**`")]


def opened_source(at, start: str, key: str = SOURCES_KEY):
    """The one expander whose label starts with ``start``, open. A page draws it shut, and shut it
    holds nothing (checked here); then it is opened by its ``key`` (that of
    :func:`ui.widgets.source_expander`) and the page run again. It stays open for the runs after,
    unless its label changes, as in the browser."""
    (box,) = [e for e in at.expander if e.label.startswith(start)]
    if not box.proto.expanded:
        assert not box.children, f"the shut expander {box.label!r} holds {len(box.children)} elements"
        at.session_state[key] = True
        at.run()
        assert not at.exception, at.exception
        (box,) = [e for e in at.expander if e.label.startswith(start)]
        assert box.proto.expanded and box.code, f"{box.label!r} did not open, or holds no code"
    return box


def softmax_and_gelu() -> set[str]:
    """Every softmax over attention rows and every GELU the forward pass may choose from, with the
    compiled loops and NumPy formulas behind them (their backward passes aside)."""
    found = set()
    for module in (layers, activations, multi_head, tuned_forward):
        for name, obj in vars(module).items():
            fn = getattr(obj, "py_func", obj)
            if (isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__
                    and ("softmax_rows" in name or "gelu" in name) and "backward" not in name):
                found.add(full_name(fn))
    return found


def forward_ran(model, ids) -> set[str]:
    """Every function a pretrained model's forward pass on ``ids`` runs, recorded here."""
    with recording() as ran:
        recorded(model.forward)(np.array(ids))
    return {full_name(fn) for fn in dispatch.functions_behind(ran)}

