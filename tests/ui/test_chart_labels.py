"""Heatmap axes label every row and column whose cell has room (ui.charts)."""
import numpy as np

from ui import charts


def _axes(spec):
    layer = (spec.get("spec") or spec)["layer"][0]["encoding"]
    return layer["x"]["axis"], layer["y"]["axis"]


def test_three_keys_are_all_labelled():
    """Streamlit's chart theme turns Vega's overlap rule on; slanted labels' upright boxes then
    "overlap" on narrow columns and every other key was hidden. Cells wide enough: rule off."""
    x, y = _axes(charts.heatmap(np.eye(4, 3), ["1 i", "2 am", "3 a", "4 student"], ["1 je", "2 suis", "3 étudiant"]))
    assert x["labelOverlap"] is False and y["labelOverlap"] is False
    grid = charts.heatmap_grid([np.eye(3)] * 2, list("abc"), list("abc"), ["h1", "h2"])
    assert all(axis["labelOverlap"] is False for axis in _axes(grid))


def test_cells_too_small_for_a_label_let_vega_thin_them():
    labels = [str(i) for i in range(128)]
    x, y = _axes(charts.heatmap(np.zeros((128, 128)), labels, labels, annotate=False))
    assert x["labelOverlap"] is True and y["labelOverlap"] is True
