"""The one-head page through AppTest: every control moves the numbers on screen as the formula
says, the empty sentence, URL state, bad matrices."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import heads, questions
from core.kernels import reference as ref

from page_support import answer_question, heatmaps, matrix_named, named, open_page, table_named
from source_support import source_names as shown_names

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
    assert [s.value for s in page.subheader] == ["Why divide by √d_k", "Asking one head for two things at once"]
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


# --- predict, then see: the √d_k switch, and why the scores are divided by √d_k ----------------------


def mean_entropy(at):
    """The mean row entropy the page shows, and the one of the weights it shows."""
    shown = next(m.value for m in at.metric if m.label == "mean row entropy (bits)")
    A = matrix_named(at, "A")
    assert float(shown) == pytest.approx(np.mean([entropy_bits(row) for row in A]), abs=6e-4)
    return float(shown), A


def test_the_scale_switch_opens_once_the_opening_question_is_answered():
    q = questions.opening("one_head")
    at = open_page(PAGE, answered=False)
    assert at.toggle(key="one_head.scaled").disabled
    wrong = next(o for i, o in enumerate(q.options) if i != q.answer)
    answer_question(at, q, wrong)                                  # a hint: still closed
    assert at.toggle(key="one_head.scaled").disabled
    answer_question(at, q, q.options[q.answer])
    assert not at.toggle(key="one_head.scaled").disabled
    at.toggle(key="one_head.scaled").set_value(False).run()
    check_formula(at, scaled=False)


def test_the_opening_answer_is_what_the_page_shows_at_the_width_it_names():
    """Switching off √d_k at the question's d_k lowers the mean row entropy, and every row's that
    can change (row 1 under the causal mask has one key)."""
    from core.lessons.questions.one_head import WIDE_D_K
    q = questions.opening("one_head")
    at = run(d_k=str(WIDE_D_K))
    on, A_on = mean_entropy(at)
    at.toggle(key="one_head.scaled").set_value(False).run()
    off, A_off = mean_entropy(at)
    check_formula(at, scaled=False)
    assert q.answer == (0 if off < on else 1 if off > on else 2)   # falls / rises / stays
    rows_on, rows_off = (np.array([entropy_bits(r) for r in A]) for A in (A_on, A_off))
    assert np.all(rows_off[1:] < rows_on[1:]) and rows_off[0] == rows_on[0] == 0.0
    assert q.options[q.answer].startswith("It falls: the rows go nearly one-hot, most of each row's weight")
    assert A_off.max(axis=1).min() > 0.5 > A_on.max(axis=1)[1:].min()   # and not so with √d_k


def test_at_d_k_1_the_switch_changes_nothing():
    """The page says switching off √d_k changes nothing at d_k = 1 (√1 = 1), and it only sharpens
    the rows from d_k = 2 on: there the rows are still far from one-hot."""
    at = run(d_k="1")
    on, A_on = mean_entropy(at)
    at.toggle(key="one_head.scaled").set_value(False).run()
    off, A_off = mean_entropy(at)
    np.testing.assert_array_equal(A_off, A_on)
    assert "nothing changes at d_k = 1" in " ".join(texts(at).split())
    at.number_input(key="one_head.d_k").set_value(2).run()
    assert mean_entropy(at)[0] > 1.0                                # d_k = 2 without √d_k: not one-hot


@pytest.mark.parametrize("link", [{}, {"d_k": "64"}, {"d_k": "64", "scaled": "0"}, {"d_k": "5", "seed": "3"}])
def test_the_variance_and_the_gradient_are_those_of_the_numbers_shown(link):
    """var(q·k) over every pair of the Q and K on screen, and divided by d_k; the largest softmax
    gradient a_i(1 - a_i) of the query row read."""
    at = run(**link)
    Q, K, A = (matrix_named(at, name) for name in "QKA")
    d_k, T = Q.shape[1], Q.shape[0]
    variance = np.var(Q @ K.T)
    assert (f"d_k = {d_k}), the {T * T} raw dot products q·k have variance **{variance:.2f}** (expected: "
            f"d_k = {d_k}; {T * T} pairs are a small sample); divided by √d_k, **{variance / d_k:.2f}**") in texts(at)
    row = A[3]                                                    # query 4, the default row read
    assert f"a score) is {np.max(row * (1 - row)):.3f}: 0.25 at most" in texts(at)


def test_a_wide_head_without_the_scale_saturates_and_passes_back_almost_nothing():
    """The reason the page gives for dividing by √d_k, in its own numbers: at d_k = 64 the raw
    scores' variance is of the order of d_k and, without √d_k, the rows go nearly one-hot and the
    softmax's largest gradient collapses."""
    at = run(d_k="64")
    gradient = lambda: max(r * (1 - r) for r in matrix_named(at, "A")[3])   # noqa: E731
    scaled = gradient()
    Q, K = matrix_named(at, "Q"), matrix_named(at, "K")
    assert 64 / 2 < np.var(Q @ K.T) < 2 * 64 and np.var(Q @ K.T / 8) < 2
    at.toggle(key="one_head.scaled").set_value(False).run()
    assert gradient() < scaled / 5 and mean_entropy(at)[0] < 0.5


# --- the scores, computed once; the source, what ran -------------------------------------------------

def test_the_scores_are_computed_once_per_redraw_and_drawn_as_computed(kernel_calls):
    """One call computes S and A (the other is the two-position head of section 6): nothing
    computes S again, and the heatmap of S is the reference's scores of the Q and K on screen."""
    at = run()
    assert kernel_calls == ["attention_with_scores", "attention_with_weights"]
    kernel_calls.clear()
    at.slider(key="one_head.temperature").set_value(0.5).run()                 # a redraw: once again
    assert kernel_calls == ["attention_with_scores", "attention_with_weights"]
    Q, K = matrix_named(at, "Q"), matrix_named(at, "K")
    T, d_k = Q.shape
    want = ref.scaled_scores(Q, K, ref.causal_mask(T), 1 / np.sqrt(d_k) / 0.5)
    drawn = named(heatmaps(at), "Scores S")
    np.testing.assert_array_equal(np.isnan(drawn), ~np.isfinite(want))         # masked cells: blank
    np.testing.assert_allclose(drawn[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-12, atol=1e-12)


def source_names(at) -> list[str]:
    """The functions the "Kernel source" expander names, in order: drivers, then the lesson's."""
    return shown_names(at, "Kernel source")


def test_the_source_names_the_functions_that_ran_and_no_other():
    at = run()
    shown = source_names(at)
    assert shown[:2] == ["core.kernels.cpu.attention_with_scores", "core.kernels.cpu.attention_with_weights"]
    for name in ("max_row_sum_error", "row_entropy_bits", "softmax_gradient_size", "dot_product_variance"):
        assert f"core.lessons.analysis.{name}" in shown
    assert "core.lessons.heads.two_positions" in shown and "core.kernels.cpu.scaled_scores" not in shown
    at.text_input(key="one_head.sentence").set_value("two words").run()        # no head of section 6
    shown = source_names(at)
    assert shown[0] == "core.kernels.cpu.attention_with_scores" and "core.kernels.cpu.attention_with_weights" not in shown
    assert "core.lessons.heads.two_positions" not in shown and "core.lessons.analysis.row_entropy_bits" in shown
