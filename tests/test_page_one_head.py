"""The one-head page through AppTest: defaults, widgets, empty sentence, URL state, bad matrices."""
from pathlib import Path

import pytest

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "one_head.py")


def run(**link):
    return open_page(PAGE, link)


def texts(at):
    return " ".join(str(e.value) for e in [*at.markdown, *at.metric, *at.warning, *at.error, *at.info])


@pytest.fixture(scope="module")
def page():
    return run()


def test_defaults_draw_without_error(page):
    assert not page.exception and not page.error
    assert page.title[0].value.startswith("One head")
    assert [s.value for s in page.subheader] == ["Asking one head for two things at once"]
    assert float(page.metric[0].value) < 1e-12                    # max |row sum - 1|
    assert "16 words" in page.text_input[0].label                 # the cap is stated
    assert "Weight on position 1: **0.446**" in texts(page)       # the two-position split


def test_widgets_change_and_rerun(page):
    page.toggle(key="one_head.causal").set_value(False).run()
    page.toggle(key="one_head.scaled").set_value(False).run()
    page.slider(key="one_head.temperature").set_value(0.3).run()
    page.number_input(key="one_head.d_k").set_value(5).run()
    page.slider(key="one_head.query").set_value(8).run()
    assert not page.exception and not page.error
    assert page.query_params["causal"] == "0" and page.query_params["d_k"] == "5"


@pytest.mark.parametrize("sentence, shown", [("", "empty"), ("x " * 20, "at most 16"), ("one", None)])
def test_sentence_edge_cases(sentence, shown):
    at = run()
    at.text_input(key="one_head.sentence").set_value(sentence).run()
    assert not at.exception
    if shown:
        assert shown in " ".join(e.value for e in at.error)
    else:
        assert not at.error and "three words" in texts(at)


def test_link_opens_the_same_configuration_and_bad_values_fall_back():
    at = run(sentence="a b c d", d_k="3", causal="0", temperature="2.5", query="2")
    assert not at.exception
    assert at.text_input(key="one_head.sentence").value == "a b c d"
    assert at.number_input(key="one_head.d_k").value == 3
    assert at.toggle(key="one_head.causal").value is False
    assert dict(at.query_params) == {"sentence": "a b c d", "d_k": "3", "causal": "0", "temperature": "2.5",
                                     "query": "2"}
    bad = run(d_k="99", temperature="hot", source="magic")
    assert not bad.exception and not bad.error
    assert "not usable" in bad.warning[0].value and bad.number_input(key="one_head.d_k").value == 2


@pytest.mark.parametrize("raw, words", [("1,2;3,4;5,6;7,8;9,10;11,12;13,14;15,", "blank"),
                                        ([["abc", 0]] * 8, "not a number"), ([[float("nan"), 0]] * 8, "NaN"),
                                        ([[float("inf"), 0]] * 8, "infinite"), ([[1e300, 0]] * 8, "beyond"),
                                        ([[1, 2]], "8 x 2")])
def test_bad_typed_matrix_warns_and_keeps_drawing(raw, words):
    at = run(source="hand")
    at.session_state["one_head.Q.typed"] = raw
    at.run()
    assert not at.exception and not at.error
    assert any(words in w.value for w in at.warning)
    assert "Q" not in at.query_params


def test_good_typed_matrix_reaches_the_link():
    at = run(source="hand")
    at.session_state["one_head.K.typed"] = [[1, 0]] * 8
    at.run()
    assert not at.warning and at.query_params["K"] == ";".join(["1,0"] * 8)
    again = run(**dict(at.query_params))
    assert not again.warning and again.query_params["K"] == at.query_params["K"]
