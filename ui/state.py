"""Page state in the address bar, so a link opens exactly the configuration on screen.

Each page declares its state as ``{name: Field}``. The pure half of this module turns values into
query-string text and back (``encode`` / ``decode``; a bad value falls back to its default with a
message, never an exception). The thin Streamlit half (``restore`` / ``publish``) seeds
``st.session_state`` from ``st.query_params`` on a page's first run and writes the current values
back after every run; widgets are then created with ``key=key(page, name)`` and no ``value=``.

Matrices travel as text, rows separated by ``;`` and entries by ``,`` (``"1,0;0,1"``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.validate import parse_matrix

# ---------------------------------------------------------------------------------------------
# pure: fields, encode, decode (no Streamlit)
# ---------------------------------------------------------------------------------------------

KINDS = ("int", "float", "bool", "choice", "text", "matrix")
MAX_TEXT = 300


@dataclass(frozen=True)
class Field:
    """One piece of page state: its kind, default and allowed range or choices."""

    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    label: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown field kind {self.kind!r}; choose one of {', '.join(KINDS)}.")


def int_field(default: int, lo: int, hi: int, label: str = "") -> Field:
    return Field("int", int(default), lo, hi, label=label)


def float_field(default: float, lo: float, hi: float, label: str = "") -> Field:
    return Field("float", float(default), lo, hi, label=label)


def bool_field(default: bool, label: str = "") -> Field:
    return Field("bool", bool(default), label=label)


def choice_field(default: str, choices: Sequence[str], label: str = "") -> Field:
    return Field("choice", default, choices=tuple(choices), label=label)


def text_field(default: str, label: str = "") -> Field:
    return Field("text", default, label=label)


def matrix_field(label: str = "") -> Field:
    """A matrix typed by hand; ``None`` (the default) means "the page's own default matrix"."""
    return Field("matrix", None, label=label)


def matrix_to_text(M) -> str:
    """``[[1, 0], [0, 1]] -> "1,0;0,1"`` (each entry to 8 significant digits, so links stay short)."""
    return ";".join(",".join(f"{float(x):.8g}" for x in row) for row in np.atleast_2d(np.asarray(M)))


def matrix_from_text(text: str) -> list[list[str]]:
    """``"1,0;0,1" -> [["1", "0"], ["0", "1"]]``: cells still text, checked later by ``parse_matrix``."""
    rows = [row.split(",") for row in str(text).strip().split(";")]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("The rows of the matrix have different lengths.")
    return rows


def parse_value(field: Field, raw, name: str = "value"):
    """One query-string value (text) as the field's Python value; ``ValueError`` when it does not fit."""
    if isinstance(raw, (list, tuple)) and field.kind != "matrix":
        raw = raw[-1] if raw else ""
    text = str(raw).strip()
    if field.kind == "text":
        if len(text) > MAX_TEXT:
            raise ValueError(f"'{name}' is longer than {MAX_TEXT} characters.")
        return str(raw)
    if field.kind == "bool":
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"'{name}' should be 1 or 0, got {text!r}.")
    if field.kind == "choice":
        if text not in field.choices:
            raise ValueError(f"'{name}' should be one of {', '.join(map(str, field.choices))}, got {text!r}.")
        return text
    if field.kind == "matrix":
        try:
            rows = raw if isinstance(raw, (list, tuple, np.ndarray)) else matrix_from_text(text)
        except ValueError as err:
            raise ValueError(f"'{name}': {err}") from None
        return parse_matrix(rows, name, limit=1e3)
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"'{name}' should be a number, got {text!r}.") from None
    if not math.isfinite(number):
        raise ValueError(f"'{name}' should be a finite number, got {text!r}.")
    if field.kind == "int":
        if number != int(number):
            raise ValueError(f"'{name}' should be a whole number, got {text!r}.")
        number = int(number)
    if (field.lo is not None and number < field.lo) or (field.hi is not None and number > field.hi):
        raise ValueError(f"'{name}' should be between {field.lo:g} and {field.hi:g}, got {text}.")
    return number


def format_value(field: Field, value) -> str:
    """The field's value as query-string text (inverse of :func:`parse_value`)."""
    if field.kind == "bool":
        return "1" if value else "0"
    if field.kind == "matrix":
        return matrix_to_text(value)
    if field.kind == "float":
        return repr(float(value)).removesuffix(".0")
    return str(value)


def _same(field: Field, a, b) -> bool:
    if field.kind == "matrix":
        return a is None and b is None or (a is not None and b is not None
                                           and np.shape(a) == np.shape(b) and np.array_equal(a, b))
    return a == b


def decode(params: Mapping[str, Any], spec: Mapping[str, Field]) -> tuple[dict, list[str]]:
    """Values for every field of ``spec`` from query parameters, and the problems met.

    Missing names take their default; a value that does not parse or is out of range takes its
    default too, and adds one readable line to the problems. Names not in ``spec`` are ignored.
    """
    values, problems = {}, []
    for name, field in spec.items():
        values[name] = field.default
        if name not in params:
            continue
        try:
            values[name] = parse_value(field, params[name], name)
        except ValueError as err:
            problems.append(f"{err} Using the default instead.")
    return values, problems


def encode(values: Mapping[str, Any], spec: Mapping[str, Field]) -> dict[str, str]:
    """Query parameters for the values that differ from their defaults (short links)."""
    return {name: format_value(field, values[name]) for name, field in spec.items()
            if name in values and values[name] is not None and not _same(field, values[name], field.default)}


# ---------------------------------------------------------------------------------------------
# Streamlit: session state <-> st.query_params
# ---------------------------------------------------------------------------------------------


def key(page: str, name: str) -> str:
    """The session-state (and widget) key of one field of one page."""
    return f"{page}.{name}"


def first_run(page: str) -> bool:
    """Whether the page has not yet run in this session (so :func:`restore` will read the link)."""
    import streamlit as st

    return key(page, "__restored") not in st.session_state


def kept_key(page: str) -> str:
    """Session key of the page's last values, held outside any widget so that nothing drops them."""
    return key(page, "__kept")


def restore(page: str, spec: Mapping[str, Field]) -> None:
    """Give every field its session-state value before any widget is drawn, on every run.

    On the page's first run the values come from the URL (problems in it are shown once as a
    warning, and those fields take their defaults). On later runs each field keeps its value: the
    one its widget holds, else the one the page last used (kept under :func:`kept_key`).

    Why every run: a run that stops early (``st.stop()`` after bad input) or a visit to another
    page leaves some widgets undrawn, and Streamlit then forgets their values, in the browser at
    once (the widget comes back at its minimum) and on the server at the next full run. Writing
    each value back through ``st.session_state`` before its widget is created is Streamlit's way
    to keep it ("interrupting the widget clean-up process" in its docs): the value survives, and
    the widget is drawn with it.
    """
    import streamlit as st

    marker = key(page, "__restored")
    first = first_run(page)
    values, problems = decode(st.query_params.to_dict() if first else {}, spec)
    kept = {} if first else st.session_state.get(kept_key(page), {})
    for name, field in spec.items():
        k = key(page, name)
        if field.kind == "matrix":
            if first and values[name] is not None:
                st.session_state[pending_key(page, name)] = values[name]
            continue
        value = st.session_state[k] if k in st.session_state else kept.get(name, values[name])
        st.session_state[k] = value
    keep(page, spec)
    if first:
        st.session_state[marker] = True
        if problems:
            st.warning("Some settings in the link were not usable:\n\n- " + "\n- ".join(problems))


def keep(page: str, spec: Mapping[str, Field]) -> None:
    """Remember the fields' present values under :func:`kept_key` (see :func:`restore`)."""
    import streamlit as st

    st.session_state[kept_key(page)] = {name: st.session_state[key(page, name)] for name, field in spec.items()
                                       if field.kind != "matrix" and key(page, name) in st.session_state}


def current(page: str, spec: Mapping[str, Field]) -> dict:
    """The fields' present values from session state."""
    import streamlit as st

    # a matrix field's key belongs to its data editor (an edit log), not to the matrix itself
    return {name: (None if field.kind == "matrix" else st.session_state.get(key(page, name), field.default))
            for name, field in spec.items()}


def publish(page: str, spec: Mapping[str, Field], active: Sequence[str] | None = None,
            extra: Mapping[str, Any] | None = None) -> None:
    """Write the fields' values to ``st.query_params`` (defaults and inactive fields removed).

    ``extra`` supplies values not held under the field's own key (matrices from an editor).
    """
    import streamlit as st

    keep(page, spec)
    values = current(page, spec)
    values.update(extra or {})
    names = set(spec) if active is None else set(active)
    wanted = encode({n: v for n, v in values.items() if n in names}, spec)
    for name in spec:
        if name in wanted:
            if st.query_params.get(name) != wanted[name]:
                st.query_params[name] = wanted[name]
        elif name in st.query_params:
            del st.query_params[name]


def pending_key(page: str, name: str) -> str:
    """Session key for a typed matrix waiting to be checked and loaded (set by a link or a test)."""
    return key(page, name) + ".typed"


def take_pending_matrix(page: str, name: str, shape: tuple[int, int], limit: float, label: str | None = None):
    """A matrix waiting under :func:`pending_key`, checked; ``None`` when there is none or it is bad.

    A bad one (blank, text, NaN, inf, too large, wrong shape) is reported with ``st.warning``,
    naming the matrix by ``label`` (what the page calls it, e.g. "W_O").
    """
    import streamlit as st

    raw = st.session_state.pop(pending_key(page, name), None)
    if raw is None:
        return None
    try:
        rows = matrix_from_text(raw) if isinstance(raw, str) else raw
        return parse_matrix(rows, label or name, shape=shape, limit=limit)
    except ValueError as err:
        st.warning(f"{err} Keeping the previous values.")
        return None


def matrix_input(page: str, name: str, default: np.ndarray, row_labels, col_labels, *,
                 label: str | None = None, editor_key: str | None = None, limit: float = 1e3,
                 row_title: str = "row") -> np.ndarray:
    """An editable matrix (``ui.widgets.matrix_editor``) that a link or a test can also fill.

    A pending matrix (from the URL, or a test setting ``st.session_state[pending_key(page, name)]``)
    is checked first; when good it replaces what the editor holds. ``label`` is the matrix's name
    in the page's words, used in every message (default: ``name``).
    """
    import streamlit as st

    from ui.widgets import as_shown, matrix_editor

    editor_key = editor_key or key(page, name)
    loaded = take_pending_matrix(page, name, np.shape(default), limit, label)
    if loaded is not None:
        st.session_state[f"{editor_key}__good"] = as_shown(loaded)
        # a fresh editor, so that no edit typed before replaces a cell of the loaded matrix
        st.session_state[f"{editor_key}__version"] = st.session_state.get(f"{editor_key}__version", 0) + 1
    return matrix_editor(editor_key, default, row_labels, col_labels, name=label or name, limit=limit,
                         row_title=row_title)
