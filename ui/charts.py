"""Altair chart builders shared by the pages.

One colour convention everywhere: attention weights (and other values in [0, 1]) use a sequential
scale fixed to [0, 1], so heatmaps side by side are comparable; signed matrices (scores, W_O,
outputs) use a diverging scale centred on 0. Every heatmap has a tooltip with row, column and value.
"""
from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

SEQUENTIAL = "viridis"
DIVERGING = "redblue"


def position_labels(tokens: Sequence[str]) -> list[str]:
    """Unique, ordered axis labels for tokens (``"1 the"``, ``"2 cat"``): repeated words stay apart."""
    return [f"{i + 1} {tok}" for i, tok in enumerate(tokens)]


def _long_form(matrix, row_labels, col_labels, value_name) -> pd.DataFrame:
    M = np.asarray(matrix, dtype=float)
    rows, cols = np.meshgrid(np.arange(M.shape[0]), np.arange(M.shape[1]), indexing="ij")
    return pd.DataFrame({
        "row": np.asarray(row_labels, dtype=object)[rows.ravel()],
        "col": np.asarray(col_labels, dtype=object)[cols.ravel()],
        value_name: M.ravel(),
    })


def color_scale(kind: str, values=None) -> alt.Scale:
    """``"weights"``: sequential on [0, 1]; ``"signed"``: diverging, symmetric around 0."""
    if kind == "weights":
        return alt.Scale(scheme=SEQUENTIAL, domain=[0.0, 1.0])
    if kind == "signed":
        peak = float(np.nanmax(np.abs(values))) if values is not None and np.size(values) else 1.0
        peak = peak if np.isfinite(peak) and peak > 0 else 1.0
        return alt.Scale(scheme=DIVERGING, domain=[-peak, peak], domainMid=0.0, reverse=True)
    if kind == "sequential":
        return alt.Scale(scheme=SEQUENTIAL)
    raise ValueError(f"unknown colour scale kind {kind!r}")


def heatmap(matrix, row_labels, col_labels, *, title: str = "", kind: str = "weights",
            value_name: str = "weight", row_title: str = "query", col_title: str = "key",
            size: int = 260, annotate: bool | None = None, domain_values=None) -> alt.Chart:
    """A matrix as coloured cells, rows top to bottom in the given order, with a tooltip.

    ``annotate`` writes the values in the cells (default: when the matrix is small).
    ``domain_values`` sets the signed scale's range from other data too (one scale for several charts).
    """
    M = np.asarray(matrix, dtype=float)
    df = _long_form(M, row_labels, col_labels, value_name)
    scale = color_scale(kind, M if domain_values is None else domain_values)
    width = max(120, min(size, 36 * M.shape[1]))
    height = max(60, min(size, 36 * M.shape[0]))
    base = alt.Chart(df).encode(
        x=alt.X("col:N", sort=list(col_labels), title=col_title, axis=alt.Axis(labelAngle=-45)),
        y=alt.Y("row:N", sort=list(row_labels), title=row_title),
    )
    cells = base.mark_rect().encode(
        color=alt.Color(f"{value_name}:Q", scale=scale, title=value_name),
        tooltip=[alt.Tooltip("row:N", title=row_title), alt.Tooltip("col:N", title=col_title),
                 alt.Tooltip(f"{value_name}:Q", format=".4f")],
    )
    layers = [cells]
    if annotate is None:
        annotate = M.size <= 100
    if annotate:
        # light text on dark cells: the middle of the scale is the threshold
        threshold = 0.5 if kind == "weights" else None
        text = base.mark_text(fontSize=10).encode(text=alt.Text(f"{value_name}:Q", format=".2f"))
        if threshold is not None:
            text = text.encode(color=alt.condition(alt.datum[value_name] < threshold,
                                                   alt.value("white"), alt.value("black")))
        layers.append(text)
    return alt.layer(*layers).properties(title=title, width=width, height=height)


def heatmap_grid(matrices, row_labels, col_labels, titles, *, kind: str = "weights",
                 value_name: str = "weight", columns: int = 4, size: int = 200, **kwargs):
    """Several heatmaps on one shared colour scale, wrapped into rows of ``columns``."""
    shared = np.concatenate([np.ravel(m) for m in matrices]) if kind == "signed" else None
    charts = [heatmap(m, row_labels, col_labels, title=t, kind=kind, value_name=value_name,
                      size=size, domain_values=shared, **kwargs) for m, t in zip(matrices, titles)]
    rows = [alt.hconcat(*charts[i:i + columns]) for i in range(0, len(charts), columns)]
    return alt.vconcat(*rows).resolve_scale(color="shared")


def bar(values, labels, *, title: str = "", x_title: str = "key", y_title: str = "weight",
        y_domain=(0.0, 1.0)) -> alt.Chart:
    """One vector as bars (e.g. one query's weights), in label order, with a tooltip."""
    df = pd.DataFrame({"label": list(labels), "value": np.asarray(values, dtype=float)})
    y_scale = alt.Scale(domain=list(y_domain)) if y_domain is not None else alt.Undefined
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("label:N", sort=list(labels), title=x_title, axis=alt.Axis(labelAngle=-45)),
        y=alt.Y("value:Q", title=y_title, scale=y_scale),
        tooltip=[alt.Tooltip("label:N", title=x_title), alt.Tooltip("value:Q", title=y_title, format=".4f")],
    ).properties(title=title, height=220)


def stem(values, positions=None, *, title: str = "", x_title: str = "key position",
         y_title: str = "weight") -> alt.Chart:
    """A stem plot (impulse response): a rule from 0 to each value, with a dot on top."""
    values = np.asarray(values, dtype=float)
    positions = np.arange(1, values.size + 1) if positions is None else np.asarray(positions)
    df = pd.DataFrame({"position": positions, "value": values, "zero": 0.0})
    base = alt.Chart(df).encode(x=alt.X("position:Q", title=x_title, axis=alt.Axis(tickMinStep=1)))
    rules = base.mark_rule(strokeWidth=2).encode(y=alt.Y("zero:Q", title=y_title), y2="value:Q")
    dots = base.mark_point(filled=True, size=60).encode(
        y="value:Q", tooltip=[alt.Tooltip("position:Q"), alt.Tooltip("value:Q", format=".4f")])
    return alt.layer(rules, dots).properties(title=title, height=200)


def lines(df: pd.DataFrame, x: str, y: str, color: str | None = None, *, title: str = "",
          x_title: str | None = None, y_title: str | None = None, y_domain=None,
          points: bool = False) -> alt.Chart:
    """Curves from a long-form frame (one row per point), coloured by ``color``, with a tooltip."""
    enc = dict(
        x=alt.X(f"{x}:Q", title=x_title or x),
        y=alt.Y(f"{y}:Q", title=y_title or y,
                scale=alt.Scale(domain=list(y_domain)) if y_domain else alt.Undefined),
        tooltip=[alt.Tooltip(f"{x}:Q"), alt.Tooltip(f"{y}:Q", format=".4f")],
    )
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=color)
        enc["tooltip"] = [alt.Tooltip(f"{color}:N")] + enc["tooltip"]
    return alt.Chart(df).mark_line(point=points).encode(**enc).properties(title=title, height=260)


# ---------------------------------------------------------------------------------------------
# Plain Vega-Lite dicts for pages that redraw on every widget change: building a dict costs
# microseconds, where Altair's objects and schema checks cost tens of milliseconds per chart.
# Render with ``st.vega_lite_chart(spec)``. Same colour conventions as above.
# ---------------------------------------------------------------------------------------------


def _scale_dict(kind: str, values) -> dict:
    if kind == "weights":
        return {"scheme": SEQUENTIAL, "domain": [0.0, 1.0]}
    peak = float(np.nanmax(np.abs(values))) if np.size(values) and not np.all(np.isnan(values)) else 1.0
    peak = peak if np.isfinite(peak) and peak > 0 else 1.0
    return {"scheme": DIVERGING, "domain": [-peak, peak], "domainMid": 0.0, "reverse": True}


def _cells(matrix, row_labels, col_labels, value_name, **extra) -> list[dict]:
    M = np.asarray(matrix, dtype=float)
    return [{"row": r, "col": c, value_name: (None if np.isnan(M[i, j]) else float(M[i, j])), **extra}
            for i, r in enumerate(row_labels) for j, c in enumerate(col_labels)]


def _heat_layers(row_labels, col_labels, *, kind, value_name, row_title, col_title, scale, annotate,
                 extra_tooltip=()) -> list[dict]:
    tooltip = [*extra_tooltip, {"field": "row", "type": "nominal", "title": row_title},
               {"field": "col", "type": "nominal", "title": col_title},
               {"field": value_name, "type": "quantitative", "format": ".4f"}]
    enc = {"x": {"field": "col", "type": "nominal", "sort": list(col_labels), "title": col_title,
                 "axis": {"labelAngle": -45}},
           "y": {"field": "row", "type": "nominal", "sort": list(row_labels), "title": row_title}}
    layers = [{"mark": "rect", "encoding": {**enc, "tooltip": tooltip, "color": {
        "field": value_name, "type": "quantitative", "scale": scale, "title": value_name}}}]
    if annotate:
        text = {**enc, "text": {"field": value_name, "type": "quantitative", "format": ".2f"}}
        if kind == "weights":
            text["color"] = {"condition": {"test": f"datum['{value_name}'] < 0.5", "value": "white"},
                             "value": "black"}
        layers.append({"mark": {"type": "text", "fontSize": 10}, "encoding": text})
    return layers


def heatmap_spec(matrix, row_labels, col_labels, *, title: str = "", kind: str = "weights",
                 value_name: str = "weight", row_title: str = "query", col_title: str = "key",
                 size: int = 260, annotate: bool | None = None, domain_values=None) -> dict:
    """:func:`heatmap` as a Vega-Lite dict (masked cells: pass NaN, they stay blank)."""
    M = np.asarray(matrix, dtype=float)
    annotate = M.size <= 100 if annotate is None else annotate
    scale = _scale_dict(kind, M if domain_values is None else np.asarray(domain_values, dtype=float))
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": title,
            "width": max(120, min(size, 36 * M.shape[1])), "height": max(60, min(size, 36 * M.shape[0])),
            "data": {"values": _cells(M, row_labels, col_labels, value_name)},
            "layer": _heat_layers(row_labels, col_labels, kind=kind, value_name=value_name,
                                  row_title=row_title, col_title=col_title, scale=scale, annotate=annotate)}


def heatmap_grid_spec(matrices, row_labels, col_labels, titles, *, kind: str = "weights",
                      value_name: str = "weight", columns: int = 4, size: int = 160,
                      annotate: bool | None = None, row_title: str = "query", col_title: str = "key") -> dict:
    """:func:`heatmap_grid` as one faceted Vega-Lite dict: one panel per matrix, one shared scale."""
    mats = [np.asarray(m, dtype=float) for m in matrices]
    annotate = mats[0].size <= 100 if annotate is None else annotate
    values = [cell for m, t in zip(mats, titles)
              for cell in _cells(m, row_labels, col_labels, value_name, panel=t)]
    scale = _scale_dict(kind, np.concatenate([m.ravel() for m in mats]))
    n_rows, n_cols = mats[0].shape
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "data": {"values": values}, "columns": columns,
            "facet": {"field": "panel", "type": "nominal", "sort": list(titles), "title": None},
            "spec": {"width": max(100, min(size, 30 * n_cols)), "height": max(60, min(size, 30 * n_rows)),
                     "layer": _heat_layers(row_labels, col_labels, kind=kind, value_name=value_name,
                                           row_title=row_title, col_title=col_title, scale=scale,
                                           annotate=annotate,
                                           extra_tooltip=({"field": "panel", "type": "nominal",
                                                           "title": "head"},))},
            "resolve": {"scale": {"color": "shared"}}}


def stem_spec(values, positions=None, *, title: str = "", x_title: str = "key position",
              y_title: str = "weight") -> dict:
    """:func:`stem` as a Vega-Lite dict."""
    values = np.asarray(values, dtype=float)
    positions = np.arange(1, values.size + 1) if positions is None else np.asarray(positions)
    data = [{"position": int(p), "value": float(v), "zero": 0.0} for p, v in zip(positions, values)]
    x = {"field": "position", "type": "quantitative", "title": x_title, "axis": {"tickMinStep": 1}}
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": title, "height": 200,
            "data": {"values": data},
            "layer": [{"mark": {"type": "rule", "strokeWidth": 2},
                       "encoding": {"x": x, "y": {"field": "zero", "type": "quantitative", "title": y_title},
                                    "y2": {"field": "value"}}},
                      {"mark": {"type": "point", "filled": True, "size": 60},
                       "encoding": {"x": x, "y": {"field": "value", "type": "quantitative"},
                                    "tooltip": [{"field": "position", "type": "quantitative"},
                                                {"field": "value", "type": "quantitative",
                                                 "format": ".4f"}]}}]}
