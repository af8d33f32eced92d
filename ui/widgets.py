"""Streamlit helpers shared by the pages: backend/precision choice, matrix editors, kernel source."""
from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import pandas as pd
import streamlit as st

from core import backend as core_backend
from core import validate
from core.kernels import dispatch
from core.kernels.dispatch import lesson_recording as recording  # noqa: F401  (pages wrap their computation in it: lesson kernels, recorded)
from core.validate import parse_matrix

BACKEND_KEY = "backend_choice"      # "auto" | "cpu" | "cuda", set in the sidebar by app.py
PRECISION_KEY = "precision_choice"  # "float64" | "float32"


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


def kernel_source(ran: dispatch.Record) -> None:
    """An expander with the source of every function that computed the page's numbers.

    ``ran`` is what ``with recording() as ran:`` collected around the page's computation: each
    driver call (its module and the seconds it took), then its host code and the kernels it
    launched, each function shown once.
    """
    if not ran:
        return
    device = ran[0].device
    where = core_backend.describe(device)
    with st.expander(f"Kernel source — {ran.seconds * 1e3:.2f} ms on {where}"):
        shown = set()
        for call in ran:
            new = [fn for fn in call.host + call.kernels if fn.__code__ not in shown]
            what = "the host driver, then the kernels it launches" if new else "the functions shown above"
            st.markdown(f"**`{call.module}.{call.operation}`** — {call.track} kernels, "
                        f"{call.seconds * 1e3:.3f} ms: {what}")
            for fn in new:
                shown.add(fn.__code__)
                st.code(inspect.getsource(fn), language="python")


def matrix_editor(key: str, default: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str],
                  *, limit: float = 1e3) -> np.ndarray:
    """An editable matrix that keeps its last good value.

    A bad cell (blank, text, NaN, inf, beyond ``±limit``) shows an inline message naming the cell,
    and the previous good matrix is returned, so the page keeps drawing.
    """
    good_key = f"{key}__good"   # ui.state.matrix_input loads matrices from links here
    if good_key not in st.session_state or np.shape(st.session_state[good_key]) != np.shape(default):
        st.session_state[good_key] = np.asarray(default, dtype=float)
    frame = pd.DataFrame(st.session_state[good_key], index=list(row_labels), columns=list(col_labels))
    edited = st.data_editor(frame, key=key, width="content")
    try:
        value = parse_matrix(edited, key, shape=np.shape(default), limit=limit)
    except ValueError as err:
        st.warning(f"{err} Keeping the last good values.")
        return st.session_state[good_key]
    st.session_state[good_key] = value
    return value


def tokens_from(sentence: str, *, max_tokens: int) -> list[str]:
    """Split a typed sentence into word tokens; refuse an empty or over-long one with a message."""
    tokens = sentence.split()
    if not tokens:
        raise ValueError("The sentence is empty: type at least one word.")
    if len(tokens) > max_tokens:
        raise ValueError(f"The sentence has {len(tokens)} words; this page shows at most {max_tokens}.")
    return tokens
