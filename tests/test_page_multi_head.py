"""The multi-head page through AppTest: the lesson's four heads on screen, widgets, links, custom heads."""
from pathlib import Path

import numpy as np
import pytest

from core import analysis, heads

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "multi_head.py")


def run(**link):
    return open_page(PAGE, link)


def markdown(at):
    return " ".join(m.value for m in at.markdown)


@pytest.fixture(scope="module")
def page():
    return run()


def test_lesson_numbers_on_screen(page):
    assert not page.exception and not page.error and not page.warning
    assert page.title[0].value == "Multi-head attention, set by hand"
    assert [s.value for s in page.subheader] == ["Open one head", "Selectivity in bits (rows: query position t)",
                                                "One wide head or H narrow ones"]
    # row 4 of the uniform head (head 4, opened by default)
    assert "Row 4 of head 4: `[0.2500, 0.2500, 0.2500, 0.2500, 0.0000, 0.0000]`" in markdown(page)
    assert "heads 1..4: **1, 2, 2, 0**" in markdown(page)
    # the entropy table equals core.analysis on the lesson heads, and the lesson's printed values
    table = page.dataframe[0].value
    Q, K = heads.lesson_heads(6, 2, 3.0)
    expected = np.array([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.490928, 0.241602, 0.241602, 1.0],
                         [3.0, 1.584963, 0.901880, 0.466890, 0.242633, 1.584963],
                         [4.0, 2.0, 1.252685, 0.467871, 0.242689, 2.0],
                         [5.0, 2.321928, 1.556962, 0.467924, 0.243721, 2.321928],
                         [6.0, 2.584963, 1.824399, 0.468905, 0.468905, 2.584963]])
    np.testing.assert_allclose(table.to_numpy(dtype=float), expected, atol=2e-6)
    assert list(table.columns) == ["t", "ceiling (bits)", "head 1", "head 2", "head 3", "head 4"]
    flops = page.dataframe[1].value
    assert flops["one wide head"].tolist() == flops["H narrow heads"].tolist() == [576, 1073741824]
    assert Q.shape == (4, 6, 2) and analysis.score_rank(Q, K).tolist() == [1, 2, 2, 0]


def test_widgets_change_and_rerun(page):
    page.number_input(key="multi_head.H").set_value(8).run()
    page.selectbox(key="multi_head.p6").set_value("two_positions").run()
    page.slider(key="multi_head.g1").set_value(9.0).run()
    page.toggle(key="multi_head.causal").set_value(False).run()
    page.number_input(key="multi_head.T").set_value(16).run()
    page.selectbox(key="multi_head.open").set_value(6).run()
    assert not page.exception and not page.error
    assert "heads 1..8" in markdown(page)
    assert dict(page.query_params) == {"H": "8", "p6": "two_positions", "g1": "9", "causal": "0", "T": "16",
                                       "open": "6"}
    page.number_input(key="multi_head.H").set_value(1).run()
    assert not page.exception and page.query_params["H"] == "1" and "p6" not in page.query_params


def test_sharper_first_token_head_spends_fewer_bits():
    at = run(g1="9", open="1", row="6")
    assert not at.exception
    table = at.dataframe[0].value
    assert table["head 1"].iloc[5] < 0.2 < 1.824399        # exercise 6: gain 9 against the lesson's 3


def test_narrow_heads_warn_and_fall_back():
    at = run(d_k="1")
    assert not at.exception and not at.error
    assert any("d_k >= 2" in w.value for w in at.warning)
    assert "heads 1..4: **1, 0, 0, 0**" in markdown(at)


def test_link_round_trip_and_bad_values():
    at = run(H="3", p1="self", g1="6.5", p3="custom", T="5", row="2", open="1")
    assert not at.exception and not at.warning
    assert at.selectbox(key="multi_head.p1").value == "self"
    assert at.slider(key="multi_head.g1").value == 6.5
    assert dict(at.query_params) == {"H": "3", "p1": "self", "g1": "6.5", "p3": "custom", "T": "5", "row": "2",
                                     "open": "1"}
    bad = run(H="12", p2="teleport", g3="-4", T="x")
    assert not bad.exception and not bad.error
    assert bad.warning[0].value.count("Using the default") == 4
    assert bad.number_input(key="multi_head.H").value == 4


def test_custom_head_from_session_state_and_bad_input():
    at = run(p1="custom", open="1")
    at.session_state["multi_head.q1.typed"] = [[0, 0]] * 5 + [[1, 0]]
    at.session_state["multi_head.k1.typed"] = [[4, 0]] + [[0, 0]] * 5
    at.run()
    assert not at.exception and not at.warning
    assert "heads 1..4: **1, 2, 2, 0**" in markdown(at)
    assert at.query_params["k1"].startswith("4,0;0,0")
    for raw, words in (("1,x;" + ";".join(["0,0"] * 5), "not a number"), ("1,0", "6 x 2"), ([[np.inf, 0]] * 6, "infinite"), ([[1e300, 0]] * 6, "beyond"),
                       ([[None, 0]] * 6, "blank")):
        at.session_state["multi_head.q1.typed"] = raw
        at.run()
        assert not at.exception and any(words in w.value for w in at.warning)
        assert at.query_params["q1"] == ";".join(["0,0"] * 5 + ["1,0"])   # the last good matrix stays
