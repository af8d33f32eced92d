"""Heatmap axes label every row and column whose cell has room, and the numbers written in cells
read as finely as the colour scale (ui.charts)."""
import re

import numpy as np
import pytest

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


# --- the numbers written in the cells ------------------------------------------------------------


def d3_format(specifier, x):
    """What Vega writes for ``x`` with a d3-format specifier of the kinds charts uses (".Nf", ".Ne").

    d3 writes ``x.toFixed(N)`` / ``x.toExponential(N)``: the exponent without padding ("3.1e-4"),
    and no minus sign on a value that rounds to zero.
    """
    match = re.fullmatch(r"\.(\d+)([fe])", specifier)
    assert match, f"a format this test does not read: {specifier!r}"
    text = format(x, specifier)
    if match[2] == "e":
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent):+d}"
    if text.startswith("-") and float(text) == 0:
        text = text[1:]
    return text


def _label_spec(spec):
    layers = (spec.get("spec") or spec)["layer"]
    (text,) = [layer for layer in layers if "text" in layer["encoding"]]
    return text["encoding"]["text"]["format"], layers[0]["encoding"]["tooltip"][-1]["format"]


def _cell_values(spec):
    name = (spec.get("spec") or spec)["layer"][0]["encoding"]["color"]["field"]
    return np.array([cell[name] for cell in spec["data"]["values"]], dtype=float)


def test_small_changes_are_labelled_distinct_and_non_zero():
    """A matrix of changes within +-0.003 (a head removed from a real model) was written "0.00" in
    every cell while its colour scale ran to 0.003."""
    change = np.array([[0.0, 0.0031, -0.0012, 0.0004],
                       [0.0031, 0.0, 0.0021, -0.0029],
                       [-0.0012, 0.0021, 0.0, 0.0007],
                       [0.0004, -0.0029, 0.0007, 0.0]])
    spec = charts.heatmap(change, list("abcd"), list("abcd"), kind="signed", value_name="change", annotate=True)
    label, _ = _label_spec(spec)
    values = sorted(set(_cell_values(spec)) - {0.0})
    labels = [d3_format(label, v) for v in values]
    assert len(set(labels)) == len(values), labels
    assert all(float(text) != 0 and np.sign(float(text)) == np.sign(v) for text, v in zip(labels, values)), labels


@pytest.mark.parametrize("peak", [300.0, 30.0, 1.0, 0.25, 0.05, 0.0031, 0.001, 0.00099, 3e-5, 3e-9])
@pytest.mark.parametrize("grid", [False, True])
def test_labels_read_as_finely_as_the_colour_scale(peak, grid):
    """Whatever the values' size, each written number is off the value it stands for by at most 5 %
    of the largest value (where the colour scale ends), and the tooltip reads at least as finely."""
    rng = np.random.default_rng(int(peak * 1e9) % 1000)
    M = rng.uniform(-peak, peak, (5, 5))
    M[0, 0], M[1, 1] = peak, -peak / 7
    labels = list("abcde")
    # a grid's first panel all zeros (a head removed): the labels follow every panel, not the first
    if grid:
        spec = charts.heatmap_grid([0 * M, M, M / 2], labels, labels, ["h1", "h2", "h3"], kind="signed", annotate=True)
    else:
        spec = charts.heatmap(M, labels, labels, kind="signed", annotate=True)
    label, tooltip = _label_spec(spec)
    values = _cell_values(spec)
    read = np.array([float(d3_format(label, v)) for v in values])
    assert np.abs(read - values).max() <= 0.05 * peak, (label, values[np.argmax(np.abs(read - values))])
    tipped = np.array([float(d3_format(tooltip, v)) for v in values])
    assert (np.abs(tipped - values) <= np.abs(read - values) + 1e-15).all(), (label, tooltip)


def test_weights_keep_two_decimal_labels():
    weights = np.array([[1.0, 0.0, 0.0], [0.43, 0.57, 0.0], [0.2, 0.3, 0.5]])
    for spec in (charts.heatmap(weights, list("abc"), list("abc")),
                 charts.heatmap_grid([weights, weights], list("abc"), list("abc"), ["h1", "h2"])):
        label, _ = _label_spec(spec)
        assert label == ".2f"
        assert {d3_format(label, v) for v in _cell_values(spec)} == {"1.00", "0.00", "0.43", "0.57", "0.20", "0.30",
                                                                      "0.50"}
