"""Opening a page through Streamlit's AppTest, as a visitor would from a link, and reading its numbers."""
import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest


def open_page(page: str, link: dict | None = None, *, answered: bool = True) -> AppTest:
    """Run ``page`` once, opened from a link whose query parameters are ``link`` (none by default).

    ``answered``: every question of the app already answered in this session, so the controls a
    page's opening question locks are open (the tests of the questions themselves pass False)."""
    at = AppTest.from_file(page, default_timeout=60)
    for name, value in (link or {}).items():
        at.query_params[name] = value
    if answered:
        answer_everything(at)
    return at.run()


def answer_everything(at: AppTest) -> None:
    """Mark every question of the app answered (right at the first try) in ``at``'s session."""
    from core.lessons import questions
    from core.lessons.predictions import RIGHT, Progress
    from ui.lesson import PROGRESS
    at.session_state[PROGRESS] = {q.key: Progress(1, True, True, RIGHT) for q in questions.everything()}


def answer_question(at: AppTest, p, answer) -> AppTest:
    """Give ``answer`` (an option's text or a typed number) to question ``p`` and press its Check."""
    field = f"predict_{p.key}"
    if p.options:
        at.radio(key=field).set_value(answer)
    else:
        at.text_input(key=field).set_value(str(answer))
    return at.button(key=f"{field}_check").click().run()


def table_named(at: AppTest, corner: str) -> pd.DataFrame:
    """The ``st.dataframe`` whose first column is headed ``corner`` (a matrix's name, e.g. ``"A"``),
    indexed by that column: its row labels."""
    found = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == corner]
    assert len(found) == 1, f"expected one table headed {corner!r}, found {len(found)}"
    return found[0].set_index(corner)


def matrix_named(at: AppTest, corner: str) -> np.ndarray:
    """The numbers of :func:`table_named` as a float array (blank cells are NaN)."""
    return table_named(at, corner).to_numpy(dtype=float)


# ----------------------------------------------------------------------------------------------
# charts: what each Vega-Lite chart on a page draws, read back from its spec and its data
# ----------------------------------------------------------------------------------------------
@dataclass
class Chart:
    """One chart of a page: ``kind`` is ``"heatmap"``, ``"grid"`` (heatmaps faceted by panel),
    ``"lines"``, ``"bars"`` or ``"stem"``; ``title`` its title's text ("" when the page writes it
    above the chart instead); ``data`` what it draws: a matrix, ``{panel title: matrix}``, the
    frame of points, or a series of values indexed by label (bars) or position (stems)."""
    kind: str
    title: str
    data: object


def _title(spec: dict) -> str:
    """A spec's title as one string: a multi-line title's lines joined by a space."""
    title = spec.get("title", "")
    if isinstance(title, dict):
        title = title.get("text", "")
    if isinstance(title, list):
        title = " ".join(title)
    return title if isinstance(title, str) else ""


def _mark(spec: dict) -> str | None:
    mark = spec.get("mark")
    return mark.get("type") if isinstance(mark, dict) else mark


def _frame(data: bytes) -> pd.DataFrame:
    return dataframe_util.convert_arrow_bytes_to_pandas_df(data)


def _cells(frame: pd.DataFrame, encoding: dict) -> np.ndarray:
    """A heatmap's cells as the matrix it draws: rows in the y axis's order, columns in the x axis's
    (so a matrix drawn transposed, or its labels' order changed, reads back as drawn). Every cell
    must be drawn exactly once; a blank (null) cell reads as NaN."""
    rows, cols = encoding["y"]["sort"], encoding["x"]["sort"]
    assert len(set(rows)) == len(rows) and len(set(cols)) == len(cols), "repeated axis labels"
    r = frame["row"].map({label: i for i, label in enumerate(rows)})
    c = frame["col"].map({label: j for j, label in enumerate(cols)})
    assert r.notna().all() and c.notna().all(), "a cell whose label is not on the axis"
    flat = r.to_numpy(int) * len(cols) + c.to_numpy(int)
    assert len(flat) == len(rows) * len(cols) and len(np.unique(flat)) == len(flat), "cells missing or drawn twice"
    matrix = np.full(len(rows) * len(cols), np.nan)
    matrix[flat] = pd.to_numeric(frame[encoding["color"]["field"]], errors="coerce").to_numpy(float)
    return matrix.reshape(len(rows), len(cols))


def _read(spec: dict, frame: pd.DataFrame | None, datasets: dict) -> Chart | None:
    """What one chart spec draws, or None for a chart that is none of the kinds read here."""
    title = _title(spec)
    if frame is None and isinstance(spec.get("data"), dict) and "name" in spec["data"]:
        frame = datasets.get(spec["data"]["name"])
    if "facet" in spec and spec["facet"].get("field") == "panel":
        layer = spec["spec"]["layer"][0]
        return Chart("grid", title, {panel: _cells(cells, layer["encoding"])
                                     for panel, cells in ((p, frame[frame["panel"] == p])
                                                          for p in spec["facet"]["sort"])})
    if "layer" in spec:
        first = spec["layer"][0]
        if _mark(first) == "rect" and first["encoding"]["x"].get("field") == "col":
            return Chart("heatmap", title, _cells(frame, first["encoding"]))
        if frame is not None and {"position", "value", "zero"} <= set(frame.columns):
            return Chart("stem", title, pd.Series(frame["value"].to_numpy(float), name=title,
                                                  index=pd.Index(frame["position"].to_numpy(), name="position")))
        for inner in spec["layer"]:             # an Altair layer (curves plus a rule): its line layer
            if _mark(inner) == "line":
                return _read({**inner, "title": title or _title(inner)}, None, datasets)
        return None
    if frame is None:
        return None
    if _mark(spec) == "line":
        return Chart("lines", title, frame.reset_index(drop=True))
    if _mark(spec) == "bar" and spec["encoding"]["x"].get("field") == "label":
        order = spec["encoding"]["x"].get("sort") or list(frame["label"])
        values = frame.set_index("label")["value"].astype(float)
        assert values.index.is_unique, "repeated bar labels"
        return Chart("bars", title, values.reindex(order).rename(title))
    return None


def charts(at: AppTest) -> list[Chart]:
    """Every chart the page drew, in page order. Streamlit moves a spec's inline ``data.values`` into
    the element's Arrow data, and an Altair chart's named data sets into its ``datasets``: both are
    read back here."""
    found = []
    for element in at.get("vega_lite_chart"):
        proto = element.proto
        spec = json.loads(proto.spec)
        frame = _frame(proto.data.data) if proto.data.data else None
        datasets = {d.name: _frame(d.data.data) for d in proto.datasets if d.data.data}
        chart = _read(spec, frame, datasets)
        if chart is not None:
            found.append(chart)
    return found


def _by_title(at: AppTest, kind: str) -> dict:
    found = {}
    for chart in charts(at):
        if chart.kind == kind:
            assert chart.title not in found, f"two {kind} charts titled {chart.title!r}: read charts(at) in order"
            found[chart.title] = chart.data
    return found


def heatmaps(at: AppTest) -> dict:
    """Every single heatmap's cells by the chart's title: ``{title: (rows, cols) array}``."""
    return _by_title(at, "heatmap")


def heatmap_grids(at: AppTest) -> list[dict]:
    """Every faceted grid of heatmaps, in page order, each ``{panel title: matrix}`` in panel order."""
    return [chart.data for chart in charts(at) if chart.kind == "grid"]


def line_charts(at: AppTest) -> dict:
    """Every line chart's points by title: ``{title: DataFrame}`` (the columns the chart encodes)."""
    return _by_title(at, "lines")


def bar_charts(at: AppTest) -> dict:
    """Every bar chart's values by title: ``{title: Series indexed by bar label, in drawn order}``."""
    return _by_title(at, "bars")


def stem_charts(at: AppTest) -> dict:
    """Every stem plot's values by title: ``{title: Series indexed by position}``."""
    return _by_title(at, "stem")


def named(found: dict, start: str):
    """The one entry of ``found`` (a by-title dict above) whose title starts with ``start``."""
    hits = [value for title, value in found.items() if title.startswith(start)]
    assert len(hits) == 1, f"expected one chart titled {start!r}..., found {len(hits)} among {list(found)}"
    return hits[0]


HANG_GUARD_S = 300.0          # a run that has not ended by then hangs: a busy machine is slow, not wrong


def button(at: AppTest, label: str):
    """The page's one button labelled ``label``."""
    found = [b for b in at.button if b.label == label]
    assert len(found) == 1, f"expected one button {label!r}, found {len(found)}"
    return found[0]


def rerun_until(at: AppTest, shown, what: str) -> None:
    """Draw the page again until ``shown(at)``; the limit only guards against a hang, and then the
    failure quotes what the page says instead of ``what``."""
    end = time.monotonic() + HANG_GUARD_S
    while not shown(at):
        assert not at.exception, at.exception
        assert time.monotonic() < end, (f"the page did not show {what} within {HANG_GUARD_S:.0f} s; it shows: "
                                        f"{[str(e.value) for e in (*at.error, *at.warning, *at.info)]}")
        time.sleep(0.2)
        at.run()


def set_tiny_encoder(at: AppTest, track: str) -> AppTest:
    """"Train an encoder" set for a quick run: 4 steps of a one-layer, d_model 16, 2-head model on
    ``track``'s training step; the page is run once with those settings."""
    at.number_input(key="training.steps").set_value(4)
    at.number_input(key="training.d_model").set_value(16)
    at.slider(key="training.layers").set_value(1)
    at.number_input(key="training.heads").set_value(2)
    at.radio(key="training.track").set_value(track)
    return at.run()
