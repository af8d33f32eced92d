"""Streamlit helpers shared by the pages: backend/precision choice, matrix editors, kernel source."""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import streamlit as st

from core import backend as core_backend
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


@st.cache_resource(show_spinner="Compiling the kernels for this backend and precision (once per server)…")
def _kernels_ready(backend_name: str, dtype_name: str) -> bool:
    core_backend.kernels(backend_name).warm_up(np.dtype(dtype_name))
    return True


def ensure_kernels() -> None:
    """Compile (or load from the disk cache) the kernels a page is about to use, behind a spinner.

    Numba compiles on first call; doing it here, once per process, keeps that cost off the redraws.
    """
    try:
        name = core_backend.resolve(chosen_backend())
    except ValueError as err:   # e.g. CUDA chosen in the sidebar on a machine without a GPU
        st.error(f"{err} Choose another backend in the sidebar.")
        st.stop()
    _kernels_ready(name, np.dtype(chosen_dtype()).name)


def timed(fn: Callable, *args, **kwargs):
    """``(result, seconds)`` of one call."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def kernel_source(operations: Sequence[str], seconds: float | None = None) -> None:
    """An expander with the Python source of the kernels that produced the numbers on the page."""
    name = core_backend.resolve(chosen_backend())
    module = core_backend.kernels(name)
    label = "Kernel source" + (f" — {seconds * 1e3:.2f} ms on {core_backend.describe(name)}" if seconds is not None else "")
    with st.expander(label):
        for op in operations:
            driver = getattr(module, op)
            kernel = module.KERNELS[op]
            st.markdown(f"**`{module.__name__}.{op}`** — host driver, then the kernel it launches")
            st.code(inspect.getsource(driver), language="python")
            st.code(inspect.getsource(getattr(kernel, "py_func", kernel)), language="python")


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
