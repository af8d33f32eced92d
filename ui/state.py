"""Page state in the address bar, so a link opens exactly the configuration on screen.

Each page declares its state as ``{name: Field}``. The pure half of this module turns values into
query-string text and back (``encode`` / ``decode``; a bad value falls back to its default with a
message that names it, never an exception). The thin Streamlit half (``restore`` / ``publish``)
seeds ``st.session_state`` from ``st.query_params`` on a page's first run and writes the current
values back after every run, so the address holds only values the page used; widgets are then
created with ``key=key(page, name)`` and no ``value=``.

Matrices travel as text, rows separated by ``;`` and entries by ``,`` (``"1,0;0,1"``).
"""
from __future__ import annotations

import difflib
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
SHOWN_CHARS = 40           # a value quoted in a message is cut to this many characters


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


def _number(x) -> str:
    """A bound or value as a person writes it: ``8``, ``0.5``, ``1000000`` (no ``1e+06``, no ``8.0``)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def shown(raw) -> str:
    """A value as it was given, quoted for a message and cut to :data:`SHOWN_CHARS` characters."""
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(r, str) for r in raw):
        raw = raw[-1]
    text = raw if isinstance(raw, str) else matrix_to_text(raw) if isinstance(raw, (list, tuple, np.ndarray)) \
        else _number(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else str(raw)
    return f"“{text[:SHOWN_CHARS]}…”" if len(text) > SHOWN_CHARS else f"“{text}”"


def describe(field: Field, value) -> str:
    """A field's value in the words of the page: ``4``, ``on``, ``“self”``, ``the page's own matrix``."""
    if field.kind == "matrix":
        return "the page's own matrix" if value is None else "the matrix given"
    if field.kind == "bool":
        return "on" if value else "off"
    if field.kind in ("int", "float"):
        return _number(value)
    if field.kind == "text" and value == "":
        return "an empty box"
    return shown(value)


def parse_value(field: Field, raw, name: str = "value"):
    """One query-string value (text) as the field's Python value.

    ``ValueError`` when it does not fit, saying what ``name`` should be (a sentence, in the page's words).
    """
    if isinstance(raw, (list, tuple)) and field.kind != "matrix":
        raw = raw[-1] if raw else ""
    text = str(raw).strip()
    if field.kind == "text":
        if len(str(raw)) > MAX_TEXT:
            raise ValueError(f"{name} may be at most {MAX_TEXT} characters long; this one has {len(str(raw))}.")
        return str(raw)
    if field.kind == "bool":
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} should be 1 (on) or 0 (off).")
    if field.kind == "choice":
        if text not in field.choices:
            raise ValueError(f"{name} should be one of {', '.join(map(str, field.choices))}.")
        return text
    if field.kind == "matrix":
        try:
            rows = raw if isinstance(raw, (list, tuple, np.ndarray)) else matrix_from_text(text)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        return parse_matrix(rows, name, limit=1e3)
    whole, span = field.kind == "int", _span(field)
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{name} should be {span}; this is not a number.") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} should be {span}, not {'NaN' if math.isnan(number) else 'infinite'}.")
    if whole and number != int(number):
        raise ValueError(f"{name} should be {span}, not a fraction.")
    if (field.lo is not None and number < field.lo) or (field.hi is not None and number > field.hi):
        raise ValueError(f"{name} should be {span}.")
    return int(number) if whole else number


def _span(field: Field) -> str:
    """What a number field takes, in words: ``a whole number from 1 to 8``."""
    kind = "a whole number" if field.kind == "int" else "a number"
    return f"{kind} from {_number(field.lo)} to {_number(field.hi)}"


def format_value(field: Field, value) -> str:
    """The field's value as query-string text (inverse of :func:`parse_value`)."""
    if field.kind == "bool":
        return "1" if value else "0"
    if field.kind == "matrix":
        return matrix_to_text(value)
    if field.kind == "float":
        return repr(float(value)).removesuffix(".0")
    if field.kind == "int" and isinstance(value, float) and value.is_integer():
        return str(int(value))       # a number input's float holding a whole number
    return str(value)


def check_value(field: Field, value, name: str = "value"):
    """A value held in the session (a widget's, or one set by code) as the field's own: an ``int`` for
    an int field. ``ValueError`` as :func:`parse_value` when it is not one the field allows."""
    if field.kind == "matrix":
        return value
    if value is None and field.kind in ("int", "float"):
        # what a number box sends when it was emptied, or got a number outside its range
        raise ValueError(f"{name} should be {_span(field)}; the box was left empty, or given a number outside that range.")
    if field.kind in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{name} should be {_span(field)}.")
    if field.kind == "bool":
        return bool(value)
    return parse_value(field, format_value(field, value), name)


def _same(field: Field, a, b) -> bool:
    if field.kind == "matrix":
        return a is None and b is None or (a is not None and b is not None
                                           and np.shape(a) == np.shape(b) and np.array_equal(a, b))
    return a == b


def link_message(name: str, given, why: str, used: str) -> str:
    """One unusable value of a link, said in full: ``H=“999”: H should be ... Using 4 instead.``"""
    return f"{name}={shown(given)} in the link: {why} Using {used} instead."


def unknown_name_message(name: str, given, spec: Mapping[str, Field]) -> str:
    """A name in the link that is none of the page's settings (a misspelling, another page's)."""
    near = difflib.get_close_matches(name, list(spec), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return (f"{name}={shown(given)} in the link: this page has no setting called “{name}”{hint}. "
            "It was ignored, and left out of the address.")


def decode(params: Mapping[str, Any], spec: Mapping[str, Field]) -> tuple[dict, list[str]]:
    """Values for every field of ``spec`` from query parameters, and the problems met.

    Missing names take their default; a value that does not parse or is out of range takes its
    default too, and a name that is not in ``spec`` is left out; each adds one readable line to the
    problems, naming the setting, the value given and the value used instead.
    """
    values, problems = {}, []
    for name, field in spec.items():
        values[name] = field.default
        if name not in params:
            continue
        try:
            values[name] = parse_value(field, params[name], name)
        except ValueError as err:
            problems.append(link_message(name, params[name], str(err),
                                         f"the default, {describe(field, field.default)}," if field.kind != "matrix"
                                         else "the default, the page's own matrix,"))
    problems += [unknown_name_message(name, raw, spec) for name, raw in params.items() if name not in spec]
    return values, problems


def encode(values: Mapping[str, Any], spec: Mapping[str, Field]) -> dict[str, str]:
    """Query parameters for the values that differ from their defaults (short links)."""
    return {name: format_value(field, values[name]) for name, field in spec.items()
            if name in values and values[name] is not None and not _same(field, values[name], field.default)}


# ---------------------------------------------------------------------------------------------
# Streamlit: session state <-> st.query_params
# ---------------------------------------------------------------------------------------------

SPECS_KEY = "__link_specs"   # session key: {page: the spec it last restored or published}


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


def link_key(page: str) -> str:
    """Session key of the link's usable values as given (text), on the page's first run only."""
    return key(page, "__link")


def _register(page: str, spec: Mapping[str, Field]) -> None:
    import streamlit as st

    st.session_state[SPECS_KEY] = {**st.session_state.get(SPECS_KEY, {}), page: dict(spec)}


def restore(page: str, spec: Mapping[str, Field]) -> None:
    """Give every field its session-state value before any widget is drawn, on every run.

    On the page's first run the values come from the URL: each value that is not usable (out of
    range, not a number, an unknown choice, a bad matrix, over-long text, a name the page does not
    have) is named in one warning with the value used instead, and :func:`publish` leaves it out of
    the address. On later runs each field keeps its value: the one its widget holds, else the one
    the page last used (kept under :func:`kept_key`). A number or choice that a widget sent and the
    field does not allow (a fraction in a whole-number box) is refused with a warning that names
    it, and the last good value stays.

    Why every run: a run that stops early (``st.stop()`` after bad input) or a visit to another
    page leaves some widgets undrawn, and Streamlit then forgets their values, in the browser at
    once (the widget comes back at its minimum) and on the server at the next full run. Writing
    each value back through ``st.session_state`` before its widget is created is Streamlit's way
    to keep it ("interrupting the widget clean-up process" in its docs): the value survives, and
    the widget is drawn with it.
    """
    import streamlit as st

    ss = st.session_state
    first = first_run(page)
    params = st.query_params.to_dict() if first else {}
    values, problems = decode(params, spec)
    ss[link_key(page)] = {name: params[name] for name in spec if name in params and _parses(spec[name], params[name])}
    kept = {} if first else ss.get(kept_key(page), {})
    refused = []
    for name, field in spec.items():
        k = key(page, name)
        if field.kind == "matrix":
            if first and values[name] is not None:
                ss[pending_key(page, name)] = values[name]
            continue
        value = ss[k] if k in ss else kept.get(name, values[name])
        if field.kind != "text":          # text is the page's to read (it says what is wrong with it)
            try:
                value = check_value(field, value, field.label or name)
            except ValueError as err:
                fallback = _usable(field, kept.get(name), values[name])
                refused.append(refusal(value, err, describe(field, fallback)))
                value = fallback
        ss[k] = value
    _register(page, spec)
    keep(page, spec)
    if first:
        ss[key(page, "__restored")] = True
        if problems:
            st.warning("Some settings in the link were not usable:\n\n- " + "\n- ".join(problems))
    if refused:
        st.warning("\n\n".join(refused))


def refusal(value, err: Exception, kept: str) -> str:
    """A value a control sent that the page refuses: what it was, why, and what stays."""
    given = "" if value is None else f"{shown(value)} is not usable here: "
    return f"{given}{err} Keeping {kept}."


def _parses(field: Field, raw) -> bool:
    try:
        parse_value(field, raw)
    except ValueError:
        return False
    return True


def _usable(field: Field, *candidates):
    """The first candidate the field allows, else its default."""
    for value in candidates:
        try:
            return check_value(field, value)
        except (ValueError, TypeError):
            continue
    return field.default


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
    """Write the fields' values to ``st.query_params``: only values the page uses, nothing else.

    Defaults, inactive fields and every name that is not in ``spec`` (a misspelt or unknown one
    from a link) are removed, so the address holds exactly what reopens this configuration.
    ``extra`` supplies values not held under the field's own key (matrices from an editor).
    """
    import streamlit as st

    _register(page, spec)
    keep(page, spec)
    values = current(page, spec)
    values.update(extra or {})
    names = set(spec) if active is None else set(active)
    wanted = encode({n: v for n, v in values.items() if n in names}, spec)
    for name in list(st.query_params):
        if name not in wanted:
            del st.query_params[name]
    for name, text in wanted.items():
        if st.query_params.get(name) != text:
            st.query_params[name] = text


def from_link(page: str, name: str):
    """The text the link gave for ``name`` on this, the page's first run; ``None`` otherwise."""
    import streamlit as st

    return st.session_state.get(link_key(page), {}).get(name)


def settle(page: str, name: str, used, why: str) -> bool:
    """Give field ``name`` a value this page can use, before its widget is drawn.

    For what the spec alone cannot check (a head the model does not have, an example past the end
    of the data): when the value replaced came from the link, a warning names it, says ``why`` (a
    sentence) and what is used instead, and the address then carries ``used``. Returns whether it
    warned.
    """
    import streamlit as st

    k = key(page, name)
    if k in st.session_state and _equal(st.session_state[k], used):
        return False
    st.session_state[k] = used
    given = st.session_state.get(link_key(page), {}).pop(name, None)
    if given is None:
        return False
    field = st.session_state.get(SPECS_KEY, {}).get(page, {}).get(name)
    st.warning(link_message(name, given, why, describe(field, used) if field else str(used)))
    return True


def vet(page: str, name: str, check) -> None:
    """Before a text box is drawn: a text the link gave that the page cannot read is named in a
    warning, and the field's default used instead (so the address drops it too).

    ``check(text)`` raises ``ValueError`` in the page's own words when the page cannot read it (a
    sentence of too many words, lengths that are not numbers); the student's own typing is the
    page's to answer, as before.
    """
    import streamlit as st

    if from_link(page, name) is None:
        return
    try:
        check(st.session_state[key(page, name)])
    except ValueError as err:
        settle(page, name, st.session_state[SPECS_KEY][page][name].default, str(err))


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except ValueError:          # arrays
        return np.array_equal(a, b)


def whole_number_input(where, label: str, min_value: int, max_value: int, *, key: str, step: int = 1,
                       **kwargs) -> int:
    """A number box for a whole number that never turns what was typed into another number unsaid.

    Streamlit's whole-number box reads the typed text with JavaScript's ``parseInt``, which stops at
    the first character that is not a digit: "1e308" becomes 1 and "2.5" becomes 2, in range, so
    taken without a word. This box holds a float in whole steps (drawn without decimals): the
    browser reads the whole number and refuses one outside ``[min_value, max_value]`` with its own
    message ("Number is above the allowed range…"), changing nothing. What reaches the server and is
    not a whole number in range (a fraction; a number outside the range, which Streamlit hands on
    as an empty box) is refused here, or by :func:`restore` for a link field, with a warning, and
    the last good value stays. Returns the value as an ``int``.
    """
    field = int_field(min_value, min_value, max_value)
    return int(_number_box(where, label, field, key=key, step=float(step), format="%.0f", **kwargs))


def decimal_number_input(where, label: str, min_value: float, max_value: float, *, key: str, step: float,
                         format: str = "%.2f", **kwargs) -> float:
    """A number box for a decimal number: as :func:`whole_number_input`, fractions allowed."""
    field = float_field(min_value, min_value, max_value)
    return float(_number_box(where, label, field, key=key, step=float(step), format=format, **kwargs))


def _number_box(where, label: str, field: Field, *, key: str, **kwargs):
    import streamlit as st

    ss, good_key = st.session_state, f"{key}.__good"
    if key not in ss:
        ss[key] = field.default
    value = ss[key]
    try:
        checked = check_value(field, value, label)
        if type(checked) is not type(value):
            ss[key] = checked
    except ValueError as err:
        fallback = _usable(field, ss.get(good_key), min(max(_finite_or(value, field.lo), field.lo), field.hi))
        st.warning(refusal(value, err, describe(field, fallback)))
        ss[key] = fallback
    # value=None: a number outside the box's range that reaches the server arrives as None (with a
    # default, Streamlit would put the default in its place, unsaid), and is refused above next run
    out = where.number_input(label, float(field.lo), float(field.hi), value=None, key=key, **kwargs)
    ss[good_key] = out
    return out


def _finite_or(value, other):
    try:
        return float(value) if math.isfinite(float(value)) else other
    except (TypeError, ValueError, OverflowError):
        return other


def pending_key(page: str, name: str) -> str:
    """Session key for a typed matrix waiting to be checked and loaded (set by a link or a test)."""
    return key(page, name) + ".typed"


def take_pending_matrix(page: str, name: str, shape: tuple[int, int], limit: float, label: str | None = None):
    """A matrix waiting under :func:`pending_key`, checked; ``None`` when there is none or it is bad.

    A bad one (blank, text, NaN, inf, too large, wrong shape) is reported with ``st.warning``,
    naming the matrix by ``label`` (what the page calls it, e.g. "W_O"), and the link's text when
    it came from the link.
    """
    import streamlit as st

    raw = st.session_state.pop(pending_key(page, name), None)
    if raw is None:
        return None
    try:
        rows = matrix_from_text(raw) if isinstance(raw, str) else raw
        return parse_matrix(rows, label or name, shape=shape, limit=limit)
    except ValueError as err:
        given = st.session_state.get(link_key(page), {}).pop(name, None)
        if given is not None:
            st.warning(link_message(name, given, str(err), "the page's own matrix"))
        else:
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
