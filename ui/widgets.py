"""Streamlit helpers shared by the pages: backend/precision choice, matrix editors, kernel source."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import numpy as np
import pandas as pd
import streamlit as st

from core import backend as core_backend
from core import validate
from core.kernels import dispatch
from core.recording import Record

BACKEND_KEY = "backend_choice"      # "auto" | "cpu" | "cuda", set in the sidebar by app.py
PRECISION_KEY = "precision_choice"  # "float64" | "float32"


def act(fn, *args) -> None:
    """Run a trainer command; a refusal (or anything unexpected) becomes a message on the page."""
    try:
        fn(*args)
    except ValueError as err:
        st.error(str(err))
    except Exception as err:   # no traceback on the page
        st.error(f"That did not work: {type(err).__name__}: {err}")


def live_view(draw, what: str, running, every: float) -> None:
    """Draw ``draw()`` in a fragment that redraws itself every ``every`` seconds while ``running()``
    (a background run trains), and reruns the whole page once when the run has ended, so the page
    shows its results. An error while drawing becomes a message ("Could not draw {what}: ..."),
    never a traceback: a fragment's own reruns bypass any try block around its first call, so the
    guard sits inside."""
    polling = running()

    @st.fragment(run_every=every if polling else None)
    def fragment() -> None:
        try:
            draw()
        except Exception as err:   # no traceback on the page
            st.error(f"Could not draw {what}: {type(err).__name__}: {err}")
        if polling and not running():
            st.rerun()             # the run ended: redraw the whole page once, with the results

    fragment()


def run_progress(view, done: float, total: float, text: str | None = None) -> None:
    """A background run's progress bar, ``done`` of ``total`` (by default "status: step done of
    total"), and its error message when the worker failed; ``view`` has ``status`` and ``message``."""
    if view.status in ("queued", "compiling"):   # its place in the server's queue, or what it waits on
        st.progress(min(done / max(total, 1), 1.0), text=f"{view.status}: {view.message}")
        return
    st.progress(min(done / max(total, 1), 1.0),
                text=f"{view.status}: step {done} of {total}" if text is None else f"{view.status}: {text}")
    if view.status == "error":
        st.error(view.message)


def chosen_backend() -> str | None:
    """The backend name the sidebar asks for (None = auto)."""
    choice = st.session_state.get(BACKEND_KEY, "auto")
    return None if choice == "auto" else choice


def chosen_dtype():
    """float64 unless the sidebar asks for float32 (lesson identities then hold to ~1e-15)."""
    return np.float32 if st.session_state.get(PRECISION_KEY) == "float32" else np.float64


@st.cache_resource(show_spinner="Compiling this page's kernels (once per server)…")
def _kernels_ready(backend_name: str, dtype_name: str, operations: tuple[str, ...]) -> bool:
    validate.warm_up(dtype_name)
    dispatch.warm_up(backend_name, dtype_name, operations)
    return True


def ensure_kernels(*operations: str) -> None:
    """Compile (or load from the disk cache) the kernels of ``operations`` (driver names such as
    ``"attention_with_weights"``) for the sidebar's backend and precision, behind a spinner.

    Only the lesson kernels of those operations, the ones a page's inputs run: Numba compiles on
    first call, so doing it here, once per process, keeps that cost off the redraws, and leaving
    every other kernel alone keeps a cold first page quick.
    """
    try:
        name = core_backend.resolve(chosen_backend())
    except ValueError as err:   # e.g. CUDA chosen in the sidebar on a machine without a GPU
        st.error(f"{err} Choose another backend in the sidebar.")
        st.stop()
    _kernels_ready(name, np.dtype(chosen_dtype()).name, operations)


@functools.lru_cache(maxsize=None)
def _source(fn) -> str:
    return inspect.getsource(getattr(fn, "py_func", fn))      # a compiled function: its Python


def _show(fn) -> None:
    st.markdown(f"**`{fn.__module__}.{fn.__qualname__}`**")
    st.code(_source(fn), language="python")


def function_sources(ran: Record) -> None:
    """The code behind a page's numbers, read from what ``with recording() as ran:`` recorded around
    them: every function that ran, by its full name with its source, in the order first run, each
    compiled one followed by the compiled functions it calls (``dispatch.functions_behind``)."""
    for fn in dispatch.functions_behind(ran):
        _show(fn)


SOURCES_KEY = "sources"   # a page's source expander; a page with several names the others ``sources:...``


def source_expander(label: str, key: str = SOURCES_KEY):
    """The expander holding the source behind a page's numbers, filled only while it is open.

    Shut, as every page first draws it, it sends no code: a page's dozens of code blocks, and the
    browser's syntax highlighter (1.5 MB of script), cost a first visit over a second. Opening it
    reruns the page, which then fills it. Returns the expander while open, else None. The label is
    part of the expander's identity: a label that changes (a training page's names the step that
    ran) shuts it, so none carries a figure that changes with every run.
    """
    box = st.expander(label, key=key, on_change="rerun")
    return box if box.open else None


def kernel_source(ran: Record, key: str = SOURCES_KEY) -> None:
    """An expander with the source of every function that computed the page's numbers.

    ``ran`` is what ``with recording() as ran:`` recorded around the page's computation: each
    kernel driver call (its module and the seconds it took), then its host code and the kernels it
    launched; then the lesson's functions that computed the page's other numbers. Each function
    is shown once.
    """
    if not ran:
        return
    where = core_backend.describe(ran[0].device)
    box = source_expander(f"Kernel source — on {where}", key)
    if box is None:
        return
    with box:
        st.caption(f"The kernels took {ran.seconds * 1e3:.2f} ms in all.")
        shown = set()
        for call in ran:
            new = [fn for fn in call.host + call.kernels if id(fn.__code__) not in shown]
            what = "the host driver, then the kernels it launches" if new else "the functions shown above"
            st.markdown(f"**`{call.module}.{call.operation}`** — {call.track} kernels, "
                        f"{call.seconds * 1e3:.3f} ms: {what}")
            for fn in new:
                shown.add(id(fn.__code__))
                st.code(inspect.getsource(fn), language="python")
        rest = [fn for fn in dispatch.functions_behind(ran) if id(fn.__code__) not in shown]
        if rest:
            st.markdown("**Then the lesson's functions** that computed the page's other numbers:")
            for fn in rest:
                _show(fn)


CELL_DIGITS = 8   # significant digits a matrix cell shows, the same as a link carries (ui.state.matrix_to_text)


def cell_text(x) -> str:
    """How a matrix cell shows the number ``x`` (8 significant digits: ``0.5``, ``-1.2345679``)."""
    return f"{float(x):.{CELL_DIGITS}g}"


def as_shown(M) -> np.ndarray:
    """``M`` as its cells show it, and so as the page uses it: each entry rounded to 8 digits."""
    return np.vectorize(lambda x: float(cell_text(x)), otypes=[float])(np.asarray(M, dtype=float))


def apply_cell_edits(good: np.ndarray, edits, row_labels: Sequence[str], col_labels: Sequence[str], *,
                     name: str, limit: float) -> tuple[np.ndarray, str | None]:
    """The matrix after a student's typed cells, or the last good one and why not.

    ``edits`` is what ``st.data_editor`` records: ``{row number: {column name: typed text}}``
    (the row-label column is read-only, so it never appears). Every cell is read exactly as
    typed (``1e308`` is 1e308, ``nan`` is not a number), so what a cell shows is what is used.
    A bad cell (blank, text, NaN, infinite, beyond ``±limit``) leaves ``good`` unchanged and
    gives one message naming the matrix, the row by its label and the column.
    """
    value = np.array(good, dtype=float)
    for row, cells in sorted((edits or {}).items(), key=lambda item: int(item[0])):
        i = int(row)
        for column, typed in cells.items():
            if column not in col_labels:
                continue
            j = list(col_labels).index(column)
            where = f"{name}, row “{row_labels[i]}”, column {column}"
            try:
                value[i, j] = validate.parse_cell(typed, where, limit)
            except ValueError as err:
                return np.array(good, dtype=float), (f"{err} The cell is back to its last good value, "
                                                     f"{cell_text(good[i, j])}, and the page uses that.")
    return value, None


def matrix_editor(key: str, default: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str],
                  *, name: str, limit: float = 1e3, row_title: str = "row") -> np.ndarray:
    """An editable matrix whose cells show exactly the numbers the page uses.

    The cells are text, read by :func:`apply_cell_edits` before the editor is drawn: a good edit
    becomes the matrix; a bad one is refused with a message in the student's words, and the
    editor is drawn afresh with the last good values, so no refused text stays in a cell. The
    row labels are a read-only column.
    """
    good_key = f"{key}__good"        # ui.state.matrix_input loads matrices from links here
    version_key = f"{key}__version"  # a new version is a fresh editor: the way to clear a refused cell
    if good_key not in st.session_state or np.shape(st.session_state[good_key]) != np.shape(default):
        st.session_state[good_key] = as_shown(default)
    version = st.session_state.get(version_key, 0)
    state = st.session_state.get(f"{key}#{version}") or {}
    value, problem = apply_cell_edits(st.session_state[good_key], state.get("edited_rows"), row_labels,
                                      col_labels, name=name, limit=limit)
    if problem:
        version += 1
        st.session_state[version_key] = version
    st.session_state[good_key] = value
    frame = pd.DataFrame({row_title: list(row_labels)}
                         | {c: [cell_text(x) for x in value[:, j]] for j, c in enumerate(col_labels)})
    st.data_editor(frame, key=f"{key}#{version}", width="content", hide_index=True, disabled=[row_title],
                   column_config={c: st.column_config.TextColumn(c, help="a number, e.g. 0.5, -2 or 1e-3")
                                  for c in col_labels})
    if problem:
        st.warning(problem)
    return value


def tokens_from(sentence: str, *, max_tokens: int) -> list[str]:
    """Split a typed sentence into word tokens; refuse an empty or over-long one with a message."""
    tokens = sentence.split()
    if not tokens:
        raise ValueError("The sentence is empty: type at least one word.")
    if len(tokens) > max_tokens:
        raise ValueError(f"The sentence has {len(tokens)} words; this page shows at most {max_tokens}.")
    return tokens
