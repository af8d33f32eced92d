"""Opening a page through Streamlit's AppTest, as a visitor would from a link, and reading its numbers."""
import json

import numpy as np
import pandas as pd
from streamlit import dataframe_util
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


def heatmaps(at: AppTest) -> dict:
    """Every heatmap's cells by the chart's title: ``{title: (T, T) array}``. Streamlit moves a spec's
    inline ``data.values`` into the element's Arrow data, read back here."""
    found = {}
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if not chart.proto.data.data or not isinstance(spec.get("title"), str):
            continue
        cells = dataframe_util.convert_arrow_bytes_to_pandas_df(chart.proto.data.data)
        if not {"row", "col"} <= set(cells.columns):
            continue
        value = next(column for column in cells.columns if column not in ("row", "col"))
        n_rows = cells["row"].nunique()
        found[spec["title"]] = cells[value].to_numpy(float).reshape(n_rows, -1)
    return found
