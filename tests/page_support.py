"""Opening a page through Streamlit's AppTest, as a visitor would from a link, and reading its numbers."""
import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest


def open_page(page: str, link: dict | None = None) -> AppTest:
    """Run ``page`` once, opened from a link whose query parameters are ``link`` (none by default)."""
    at = AppTest.from_file(page, default_timeout=60)
    for name, value in (link or {}).items():
        at.query_params[name] = value
    return at.run()


def table_named(at: AppTest, corner: str) -> pd.DataFrame:
    """The ``st.dataframe`` whose first column is headed ``corner`` (a matrix's name, e.g. ``"A"``),
    indexed by that column: its row labels."""
    found = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == corner]
    assert len(found) == 1, f"expected one table headed {corner!r}, found {len(found)}"
    return found[0].set_index(corner)


def matrix_named(at: AppTest, corner: str) -> np.ndarray:
    """The numbers of :func:`table_named` as a float array (blank cells are NaN)."""
    return table_named(at, corner).to_numpy(dtype=float)
