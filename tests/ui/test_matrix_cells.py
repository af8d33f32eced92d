"""Typed matrix cells (ui.widgets): read exactly as typed, refused in the student's words, labels read-only.

AppTest cannot type into ``st.data_editor``, so the reading of the editor's edits is a pure function
(:func:`ui.widgets.apply_cell_edits`), tested here; tests/browser/test_browser_ui.py types into the real one.
"""
import numpy as np
import pytest

from ui.widgets import apply_cell_edits, as_shown, cell_text

LABELS, COLS = ["1 The", "2 cat", "3 sat"], ["f1", "f2"]
GOOD = np.array([[0.5, -1.0], [2.0, 0.25], [0.0, 3.0]])


def edit(edits):
    return apply_cell_edits(GOOD, edits, LABELS, COLS, name="Q", limit=1e3)


def test_a_good_cell_is_used_exactly_as_typed():
    value, problem = edit({1: {"f1": "2.5e2"}, "2": {"f2": " -7 "}})
    assert problem is None
    expected = GOOD.copy()
    expected[1, 0], expected[2, 1] = 250.0, -7.0
    np.testing.assert_array_equal(value, expected)


@pytest.mark.parametrize("typed, words", [
    ("1e308", "is 1e+308, beyond the limit of ±1,000"),   # not 1308: the text as typed
    ("NaN", "NaN"), ("nan", "NaN"), ("inf", "infinite"), ("", "blank"), (None, "blank"),
    ("abc", "not a number"), ("1,5", "not a number"),
])
def test_a_bad_cell_keeps_the_last_good_matrix_and_says_where(typed, words):
    value, problem = edit({0: {"f2": "4"}, 1: {"f1": typed}})
    np.testing.assert_array_equal(value, GOOD)                 # nothing changes, not even the good cell
    assert words in problem
    assert problem.startswith("Q, row “2 cat”, column f1")     # the matrix, the token, the column
    assert "back to its last good value, 2" in problem         # what the cell shows again


def test_no_edit_and_the_label_column_change_nothing():
    for edits in (None, {}, {0: {"token": "1 dog50"}}):
        value, problem = edit(edits)
        assert problem is None
        np.testing.assert_array_equal(value, GOOD)


def test_cells_show_eight_digits_and_the_page_uses_what_they_show():
    M = np.array([[0.12573022117970238, -1e-9], [123456789.0, 1.0]])
    assert [cell_text(x) for x in M.ravel()] == ["0.12573022", "-1e-09", "1.2345679e+08", "1"]
    np.testing.assert_array_equal(as_shown(M), [[0.12573022, -1e-09], [123456790.0, 1.0]])
    np.testing.assert_array_equal(as_shown(as_shown(M)), as_shown(M))
