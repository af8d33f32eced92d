"""Chart builders shared by the pages, as Vega-Lite specifications (render with ``st.vega_lite_chart``).

Vega-Lite is the grammar Altair writes; we build its dictionaries directly because a page redraws
on every widget change, and constructing and schema-checking Altair objects costs tens to hundreds
of milliseconds per chart, where a dictionary costs microseconds.

One colour convention everywhere: attention weights (values in [0, 1]) use a sequential scale fixed
to [0, 1], so heatmaps side by side are comparable; signed matrices (scores, W_O, outputs) use a
diverging scale centred on 0. Every heatmap has a tooltip with row, column and value; NaN cells
(e.g. masked scores) stay blank.

Light and dark themes: no mark colour here depends on the page's background. Axes, titles and
legends take the theme's colours (``st.vega_lite_chart``'s default ``theme="streamlit"``); bars,
lines and stems take the theme's series colours (``chartCategoricalColors`` in
``.streamlit/config.toml``, one palette per theme); the numbers written in heatmap cells are black
or white by the colour of their cell, which is the same in both themes.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

SEQUENTIAL = "viridis"
DIVERGING = "redblue"
# Where the numbers written in cells turn from black to white: the point where the cell's colour
# gives white text the better contrast (relative luminance 0.18), from Vega's colour stops of each
# scheme, linearly interpolated as Vega does. Either side, text keeps at least 4.5:1 against its
# cell (the browser test measures it). viridis: below 0.43 of [0, 1]. redblue: beyond 0.73 of the
# peak on the red (positive) side, 0.79 on the blue (negative) side, whose dark end is lighter.
WHITE_TEXT_BELOW_WEIGHT = 0.43
WHITE_TEXT_BEYOND_PEAK = {"positive": 0.73, "negative": 0.79}
_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


def position_labels(tokens: Sequence[str]) -> list[str]:
    """Unique, ordered axis labels for tokens (``"1 the"``, ``"2 cat"``): repeated words stay apart."""
    return [f"{i + 1} {tok}" for i, tok in enumerate(tokens)]


def color_scale(kind: str, values=None) -> dict:
    """``"weights"``: sequential on [0, 1]; ``"signed"``: diverging, symmetric around 0."""
    if kind == "weights":
        return {"scheme": SEQUENTIAL, "domain": [0.0, 1.0]}
    if kind != "signed":
        raise ValueError(f"unknown colour scale kind {kind!r}")
    values = np.asarray(values if values is not None else [], dtype=float)
    finite = values[np.isfinite(values)]
    peak = float(np.abs(finite).max()) if finite.size else 1.0
    peak = peak if peak > 0 else 1.0
    return {"scheme": DIVERGING, "domain": [-peak, peak], "domainMid": 0.0, "reverse": True}


def _cells(matrix, row_labels, col_labels, value_name, **extra) -> list[dict]:
    M = np.asarray(matrix, dtype=float)
    return [{"row": r, "col": c, value_name: (float(M[i, j]) if np.isfinite(M[i, j]) else None), **extra}
            for i, r in enumerate(row_labels) for j, c in enumerate(col_labels)]


def label_format(values) -> str:
    """The d3 number format for the numbers written in cells, chosen from the largest ``|value|``.

    ``".2f"`` when it is 0.1 or more (weights, scores: "0.43", "-12.07"). Below, enough decimals to
    write it with two significant digits ("0.031", "0.0031"): a matrix of changes within +-0.003,
    written ".2f", read "0.00" in every cell while its colour scale ran to 0.003. Below 0.001,
    scientific with two significant digits ("3.1e-4"), as short as "0.0031". Either way a label is
    off by at most 5 % of the largest value, the colour scale's own resolution.
    """
    finite = np.abs(np.asarray(values, dtype=float))
    finite = finite[np.isfinite(finite)]
    peak = float(finite.max()) if finite.size else 0.0
    if not peak or peak >= 0.1:
        return ".2f"
    if peak < 1e-3:
        return ".1e"
    return f".{1 - int(np.floor(np.log10(peak)))}f"


def _tooltip_format(label: str) -> str:
    """The tooltip's format: four decimals, or four significant digits where the labels need
    scientific notation (a tooltip never reads less than its cell)."""
    return ".3e" if label.endswith("e") else ".4f"


def _heat_layers(row_labels, col_labels, *, kind, value_name, row_title, col_title, scale, annotate,
                 extra_tooltip=(), every_label=(True, True), label: str = ".2f") -> list[dict]:
    """The cells (and their numbers, in the d3 format ``label``: see :func:`label_format`).
    ``every_label``: (rows, columns) whose cells are tall or wide enough to label each one (see
    :func:`_labels_fit`); elsewhere Vega thins the labels."""
    tooltip = [*extra_tooltip, {"field": "row", "type": "nominal", "title": row_title},
               {"field": "col", "type": "nominal", "title": col_title},
               {"field": value_name, "type": "quantitative", "format": _tooltip_format(label)}]
    enc = {"x": {"field": "col", "type": "nominal", "sort": list(col_labels), "title": col_title,
                 "axis": {"labelAngle": -45, "labelOverlap": not every_label[1]}},
           "y": {"field": "row", "type": "nominal", "sort": list(row_labels), "title": row_title,
                 "axis": {"labelOverlap": not every_label[0]}}}
    layers = [{"mark": "rect", "encoding": {**enc, "tooltip": tooltip, "color": {
        "field": value_name, "type": "quantitative", "scale": scale, "title": value_name}}}]
    if annotate:
        text = {**enc, "text": {"field": value_name, "type": "quantitative", "format": label}}
        text["color"] = {"condition": {"test": _dark_cell_test(kind, value_name, scale), "value": "white"},
                         "value": "black"}
        layers.append({"mark": {"type": "text", "fontSize": 10}, "encoding": text,
                       "transform": [{"filter": f"isValid(datum['{value_name}'])"}]})  # blank cells stay blank
    return layers


def _dark_cell_test(kind: str, value_name: str, scale: dict) -> str:
    """A Vega expression true for the cells dark enough to need white text (see WHITE_TEXT_*)."""
    v = f"datum['{value_name}']"
    if kind == "weights":
        return f"{v} < {WHITE_TEXT_BELOW_WEIGHT}"
    peak = scale["domain"][1]
    return (f"{v} >= {WHITE_TEXT_BEYOND_PEAK['positive'] * peak!r} || "
            f"{v} <= {-WHITE_TEXT_BEYOND_PEAK['negative'] * peak!r}")


# Vega hides labels whose boxes overlap, and the box of a slanted label is its upright bounding
# box, so on narrow columns it hid every other key even when the slanted text had room. A cell at
# least this many pixels across holds one line of axis text (11 px) with a gap: label every one.
MIN_LABELLED_CELL = 14


def _labels_fit(row_px: int, col_px: int) -> tuple[bool, bool]:
    """Whether every row label and every column label fits beside its cell."""
    return row_px >= MIN_LABELLED_CELL, col_px >= MIN_LABELLED_CELL


def _cell(size: int, n: int, annotate: bool = False) -> int:
    """Pixels per cell so that ``n`` cells span about ``size`` pixels (2 to 36 each; at least 28
    when the cells carry their numbers, so that "-0.43" fits)."""
    return int(max(28 if annotate else 2, min(36, size // max(n, 1))))


def heatmap(matrix, row_labels, col_labels, *, title: str = "", kind: str = "weights",
            value_name: str = "weight", row_title: str = "query", col_title: str = "key",
            size: int = 260, annotate: bool | None = None, domain_values=None) -> dict:
    """A matrix as coloured cells, rows top to bottom in the given order, with a tooltip.

    ``annotate`` writes the values in the cells (default: when the matrix is small).
    ``domain_values`` sets the signed scale's range from other data too (one scale for several charts).
    """
    M = np.asarray(matrix, dtype=float)
    annotate = M.size <= 100 if annotate is None else annotate
    scale = color_scale(kind, M if domain_values is None else domain_values)
    col_px, row_px = _cell(size, M.shape[1], annotate), _cell(size, M.shape[0])
    # Sized by cell ("step"), not by a total: a fixed total height is shrunk to fit the title, axes
    # and legend when Streamlit fits the chart into a narrow column, squashing small matrices flat.
    return {"$schema": _SCHEMA, "title": title,
            "width": {"step": col_px}, "height": {"step": row_px},
            "data": {"values": _cells(M, row_labels, col_labels, value_name)},
            "layer": _heat_layers(row_labels, col_labels, kind=kind, value_name=value_name,
                                  row_title=row_title, col_title=col_title, scale=scale, annotate=annotate,
                                  every_label=_labels_fit(row_px, col_px), label=label_format(M))}


def heatmap_grid(matrices, row_labels, col_labels, titles, *, kind: str = "weights",
                 value_name: str = "weight", columns: int = 4, size: int = 160,
                 annotate: bool | None = None, row_title: str = "query", col_title: str = "key",
                 panel_title: str = "head") -> dict:
    """Several heatmaps as one faceted chart: one panel per matrix, one shared colour scale."""
    mats = [np.asarray(m, dtype=float) for m in matrices]
    annotate = mats[0].size <= 100 if annotate is None else annotate
    values = [cell for m, t in zip(mats, titles) for cell in _cells(m, row_labels, col_labels, value_name, panel=t)]
    scale = color_scale(kind, np.concatenate([m.ravel() for m in mats]))
    n_rows, n_cols = mats[0].shape
    col_px, row_px = _cell(size, n_cols, annotate), _cell(size, n_rows)
    return {"$schema": _SCHEMA, "data": {"values": values}, "columns": columns,
            "facet": {"field": "panel", "type": "nominal", "sort": list(titles), "title": None},
            "spec": {"width": {"step": col_px}, "height": {"step": row_px},
                     "layer": _heat_layers(row_labels, col_labels, kind=kind, value_name=value_name,
                                           row_title=row_title, col_title=col_title, scale=scale,
                                           annotate=annotate, every_label=_labels_fit(row_px, col_px),
                                           label=label_format(np.concatenate([m.ravel() for m in mats])),
                                           extra_tooltip=({"field": "panel", "type": "nominal",
                                                           "title": panel_title},))},
            "resolve": {"scale": {"color": "shared"}}}


def bar(values, labels, *, title: str = "", x_title: str = "key", y_title: str = "weight",
        y_domain=(0.0, 1.0)) -> dict:
    """One vector as bars (e.g. one query's weights), in label order, with a tooltip."""
    data = [{"label": str(k), "value": float(v)} for k, v in zip(labels, np.asarray(values, dtype=float))]
    y = {"field": "value", "type": "quantitative", "title": y_title}
    if y_domain is not None:
        y["scale"] = {"domain": list(y_domain)}
    return {"$schema": _SCHEMA, "title": title, "height": 220, "data": {"values": data}, "mark": "bar",
            "encoding": {"x": {"field": "label", "type": "nominal", "sort": [str(k) for k in labels],
                               "title": x_title, "axis": {"labelAngle": -45}},
                         "y": y,
                         "tooltip": [{"field": "label", "type": "nominal", "title": x_title},
                                     {"field": "value", "type": "quantitative", "title": y_title,
                                      "format": ".4f"}]}}


def stem(values, positions=None, *, title: str = "", x_title: str = "key position",
         y_title: str = "weight") -> dict:
    """A stem plot (impulse response): a stem from 0 to each value, with a dot on top.

    The stems are 2-pixel bars rather than rules: Vega-Lite draws rules black by default, which
    vanishes on a dark background, while bars and dots take the theme's series colour.
    """
    values = np.asarray(values, dtype=float)
    positions = np.arange(1, values.size + 1) if positions is None else np.asarray(positions)
    data = [{"position": int(p), "value": float(v), "zero": 0.0} for p, v in zip(positions, values)]
    x = {"field": "position", "type": "quantitative", "title": x_title, "axis": {"tickMinStep": 1}}
    return {"$schema": _SCHEMA, "title": title, "height": 200, "data": {"values": data},
            "layer": [{"mark": {"type": "bar", "size": 2},
                       "encoding": {"x": x, "y": {"field": "zero", "type": "quantitative", "title": y_title},
                                    "y2": {"field": "value"}}},
                      {"mark": {"type": "point", "filled": True, "size": 60, "opacity": 1},
                       "encoding": {"x": x, "y": {"field": "value", "type": "quantitative"},
                                    "tooltip": [{"field": "position", "type": "quantitative"},
                                                {"field": "value", "type": "quantitative", "format": ".4f"}]}}]}


def lines(df: pd.DataFrame, x: str, y: str, color: str | None = None, *, title: str = "",
          x_title: str | None = None, y_title: str | None = None, y_domain=None,
          points: bool = False) -> dict:
    """Curves from a long-form frame (one row per point), coloured by ``color``, with a tooltip."""
    y_enc = {"field": y, "type": "quantitative", "title": y_title or y}
    if y_domain:
        y_enc["scale"] = {"domain": list(y_domain)}
    enc = {"x": {"field": x, "type": "quantitative", "title": x_title or x}, "y": y_enc,
           "tooltip": [{"field": x, "type": "quantitative"}, {"field": y, "type": "quantitative", "format": ".4f"}]}
    if color:
        # in the frame's order, not alphabetical: a run keeps its colour in every chart that lists the runs
        enc["color"] = {"field": color, "type": "nominal", "title": color, "sort": None}
        enc["tooltip"].insert(0, {"field": color, "type": "nominal"})
    columns = [c for c in (x, y, color) if c]
    records = df[columns].to_dict("records")
    return {"$schema": _SCHEMA, "title": title, "height": 260, "data": {"values": records},
            "mark": {"type": "line", "point": points}, "encoding": enc}


