"""The one-head page through AppTest: every control moves the numbers on screen as the formula
says, the empty sentence, URL state, bad matrices."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import heads
from core.kernels import reference as ref

from page_support import matrix_named, open_page, table_named

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "one_head.py")


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


def entropy_bits(row):
    p = row[row > 0]
    return float(-(p * np.log2(p)).sum())


def check_formula(at, *, scaled=True, tau=1.0, causal=True):
    """The scores and weights on screen are the formula applied to the Q and K on screen:
    S = Q K^T / (sqrt(d_k) tau) + M (scale 1 without sqrt(d_k)), A = softmax(S)."""
    assert not at.exception and not at.error
    Q, K, S, A = (matrix_named(at, name) for name in "QKSA")
    T, d_k = Q.shape
    mask = ref.causal_mask(T) if causal else None
    want_S = ref.scaled_scores(Q, K, mask, (1 / np.sqrt(d_k) if scaled else 1.0) / tau)
    want_A = ref.softmax(want_S)
    np.testing.assert_allclose(A, want_A, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isnan(S), ~np.isfinite(want_S))     # masked cells: blank
    np.testing.assert_allclose(S[np.isfinite(want_S)], want_S[np.isfinite(want_S)], rtol=1e-12, atol=1e-12)
    upper = np.triu_indices(T, 1)
    if causal:
        assert np.all(A[upper] == 0.0)
    else:
        assert np.all(A[upper] > 0.0)
    return Q, A


def test_defaults_follow_the_formula(page):
    Q, A = check_formula(page)
    assert Q.shape == (8, 2) and list(table_named(page, "A").index) == [
        "1 The", "2 tired", "3 cat", "4 sat", "5 on", "6 the", "7 warm", "8 mat"]


@pytest.mark.parametrize("widget, key, value, formula", [
    ("toggle", "scaled", False, dict(scaled=False)),          # A = softmax(Q K^T + M)
    ("slider", "temperature", 0.3, dict(tau=0.3)),            # the scores divided by tau
    ("toggle", "causal", False, dict(causal=False)),          # no mask: nothing zeroed
    ("number_input", "d_k", 5, {}),                           # 5 features, scale 1/sqrt(5)
    ("number_input", "seed", 7, {}),                          # other queries and keys
])
def test_each_control_moves_the_weights_as_the_formula_says(widget, key, value, formula):
    at = run()
    Q_before, A_before = check_formula(at)
    getattr(at, widget)(key=f"one_head.{key}").set_value(value).run()
    Q, A = check_formula(at, **formula)
    assert np.abs(A - A_before).max() > 1e-2                  # the control did move the weights
    assert at.query_params[key] == {False: "0"}.get(value, str(value))
    if key == "d_k":
        assert Q.shape == (8, 5)
    if key in ("d_k", "seed"):
        assert not np.allclose(Q[:, :2], Q_before)


def test_sentence_sets_the_tokens():
    at = run()
    at.text_input(key="one_head.sentence").set_value("a b a c").run()
    check_formula(at)
    assert list(table_named(at, "A").index) == ["1 a", "2 b", "3 a", "4 c"]
    assert matrix_named(at, "A").shape == (4, 4)


def test_typed_queries_and_keys_are_the_ones_attended_with():
    at = run(source="hand", causal="0", scaled="0")
    Q = [[1, 0], [0, 1], [2, 2], [0, 0], [1, 1], [-1, 0], [0, -2], [3, 0]]
    K = [[0, 1], [1, 0], [1, 1], [2, 0], [0, 0], [0, 3], [-1, 1], [1, -1]]
    at.session_state["one_head.Q.typed"] = Q
    at.session_state["one_head.K.typed"] = K
    at.run()
    assert not at.warning
    shown_Q, A = check_formula(at, scaled=False, causal=False)
    np.testing.assert_array_equal(shown_Q, Q)
    np.testing.assert_array_equal(matrix_named(at, "K"), K)
    np.testing.assert_allclose(A[2], ref.softmax(np.array(K) @ [2, 2]), rtol=1e-12)   # row 3, by hand


@pytest.mark.parametrize("query", [2, 6])
def test_query_row_is_the_one_read_out(query):
    at = run(query=str(query))
    _, A = check_formula(at)
    text = texts(at)
    assert f"Query {query} blends its values with {entropy_bits(A[query - 1]):.3f} bits" in text
    # the two-position head asks from query max(q, 3) for positions 1 and that query - 1
    qa = max(query, 3)
    pair = heads.two_positions(8, 2, heads.DEFAULT_GAIN, query=qa, targets=(1, qa - 1))
    row = ref.attention(*pair, np.eye(8), ref.causal_mask(8))[1][qa - 1]
    assert f"Weight on position 1: **{row[0]:.3f}**, on position {qa - 1}: **{row[qa - 2]:.3f}**" in text
    assert row[0] == pytest.approx(row[qa - 2], abs=1e-3) and row[0] > 0.4


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
