"""The multi-head page through AppTest: the lesson's four heads on screen, widgets, links, custom heads."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from core.lessons import analysis
from core.lessons import heads, questions
from core.lessons.questions.multi_head import PREVIOUS_HEAD, QUERY_T
from core.kernels import reference as ref

from page_support import answer_question, charts, heatmaps, named, open_page
from source_support import source_names as shown_names

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "multi_head.py")


def run(**link):
    return open_page(PAGE, link)


def markdown(at):
    return " ".join(m.value for m in at.markdown)


def table_headed(at, first):
    """The one st.dataframe whose first column is ``first``."""
    found = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == first]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def page():
    return run()


def test_lesson_numbers_on_screen(page):
    assert not page.exception and not page.error and not page.warning
    assert page.title[0].value == "Multi-head attention, set by hand"
    assert [s.value for s in page.subheader] == ["Open one head", "Impulse responses at row 4, every head side by side",
                                                "Selectivity in bits (rows: query position t)",
                                                "One wide head or H narrow ones"]
    # row 4 of the uniform head (head 4, opened by default)
    assert "Row 4 of head 4: `[0.2500, 0.2500, 0.2500, 0.2500, 0.0000, 0.0000]`" in markdown(page)
    assert "heads 1..4: **1, 2, 2, 0**" in markdown(page)
    # the entropy table equals core.lessons.analysis on the lesson heads, and the lesson's printed values
    table = table_headed(page, "t")
    Q, K = heads.lesson_heads(6, 2, 3.0)
    expected = np.array([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.490928, 0.241602, 0.241602, 1.0],
                         [3.0, 1.584963, 0.901880, 0.466890, 0.242633, 1.584963],
                         [4.0, 2.0, 1.252685, 0.467871, 0.242689, 2.0],
                         [5.0, 2.321928, 1.556962, 0.467924, 0.243721, 2.321928],
                         [6.0, 2.584963, 1.824399, 0.468905, 0.468905, 2.584963]])
    np.testing.assert_allclose(table.to_numpy(dtype=float), expected, atol=2e-6)
    assert list(table.columns) == ["t", "ceiling (bits)", "head 1", "head 2", "head 3", "head 4"]
    flops = table_headed(page, "T")
    assert flops["one wide head"].tolist() == flops["H narrow heads"].tolist() == [576, 1073741824]
    # drawn with thousands separators (1,073,741,824): the columns' number format
    config = json.loads(next(d for d in page.dataframe if d.value.columns[0] == "T").proto.columns)
    assert {config[c]["type_config"]["format"] for c in ("one wide head", "H narrow heads")} == {"localized"}
    assert Q.shape == (4, 6, 2) and analysis.score_rank(Q, K).tolist() == [1, 2, 2, 0]


def entropy_bits(A):
    logs = np.log2(np.where(A > 0, A, 1.0))
    return -(A * logs).sum(-1)


def check_heads(at, *, T=6, d_k=2, H=4, causal=True, presets=None, gains=None, open_head=4, row=4, typed=None):
    """The entropy table, the opened row and the ranks on screen are those of the heads the
    settings describe: A_h = softmax(Q_h K_h^T / sqrt(d_k) + M) for each head's preset and gain."""
    assert not at.exception and not at.error
    presets = {**{h: heads.LESSON_HEADS[(h - 1) % 4] for h in range(1, H + 1)}, **(presets or {})}
    gains = {**{h: heads.DEFAULT_GAIN for h in range(1, H + 1)}, **(gains or {})}
    mask = ref.causal_mask(T) if causal else None
    A, ranks = [], []
    for h in range(1, H + 1):
        Q, K = (typed or {}).get(h) or heads.build_head(presets[h], T, d_k, gains[h])
        Q, K = np.asarray(Q, float), np.asarray(K, float)
        A.append(ref.softmax(ref.scaled_scores(Q, K, mask)))
        ranks.append(np.linalg.matrix_rank(Q @ K.T))
    A = np.array(A)                                                   # (H, T, T)
    table = next(d.value for d in at.dataframe if list(d.value.columns[:1]) == ["t"])   # not the editors
    assert list(table.columns) == ["t", "ceiling (bits)"] + [f"head {h}" for h in range(1, H + 1)]
    np.testing.assert_array_equal(table["t"], np.arange(1, T + 1))
    visible = np.arange(1, T + 1) if causal else np.full(T, T)
    np.testing.assert_allclose(table["ceiling (bits)"], np.log2(visible), atol=1e-6)
    np.testing.assert_allclose(table.iloc[:, 2:].to_numpy(float), entropy_bits(A).T, atol=2e-6)
    weights = ", ".join(f"{w:.4f}" for w in A[open_head - 1, row - 1])
    assert f"Row {row} of head {open_head}: `[{weights}]`" in markdown(at)
    assert f"heads 1..{H}: **{', '.join(map(str, ranks))}**" in markdown(at)
    return A


def test_defaults_are_the_lesson_heads(page):
    A = check_heads(page)
    assert np.all(A[:, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0.0)


@pytest.mark.parametrize("steps, settings", [
    ([("number_input", "H", 8)], dict(H=8)),                               # heads 5..8 repeat the four
    ([("number_input", "H", 8), ("selectbox", "p6", "two_positions")], dict(H=8, presets={6: "two_positions"})),
    ([("selectbox", "p2", "self")], dict(presets={2: "self"})),
    ([("slider", "g1", 9.0)], dict(gains={1: 9.0})),
    ([("slider", "g3", 0.5)], dict(gains={3: 0.5})),
    ([("toggle", "causal", False)], dict(causal=False)),
    ([("number_input", "T", 16)], dict(T=16)),
    ([("number_input", "d_k", 3)], dict(d_k=3)),
    ([("selectbox", "open", 1), ("slider", "row", 6)], dict(open_head=1, row=6)),
])
def test_each_control_moves_the_numbers_as_the_heads_say(steps, settings):
    at = run()
    before = check_heads(at)
    for widget, key, value in steps:
        getattr(at, widget)(key=f"multi_head.{key}").set_value(value).run()
    after = check_heads(at, **settings)
    if "open_head" not in settings:                                      # a control of the heads:
        assert after.shape != before.shape or np.abs(after - before).max() > 1e-3   # they moved
    expected_link = {key: {False: "0"}.get(value, str(value)) for _, key, value in steps}
    assert dict(at.query_params) == {k: v.removesuffix(".0") for k, v in expected_link.items()}


def test_fewer_heads_drop_their_settings_from_the_link():
    at = run(H="8", p6="two_positions")
    check_heads(at, H=8, presets={6: "two_positions"})
    at.number_input(key="multi_head.H").set_value(1).run()
    check_heads(at, H=1, open_head=1)
    assert dict(at.query_params) == {"H": "1", "open": "1"}          # head 4 no longer exists


def test_sharper_first_token_head_spends_fewer_bits():
    at = run(g1="9", open="1", row="6")
    assert not at.exception
    table = table_headed(at, "t")
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
    Q, K = [[0, 0]] * 5 + [[1, 0]], [[4, 0]] + [[0, 0]] * 5
    at.session_state["multi_head.q1.typed"] = Q
    at.session_state["multi_head.k1.typed"] = K
    at.run()
    assert not at.exception and not at.warning
    A = check_heads(at, typed={1: (Q, K)}, open_head=1)
    e = np.exp(4 / np.sqrt(2))                                      # only query 6 asks for key 1
    assert A[0, 5, 0] == pytest.approx(e / (e + 5)) and A[0, 4, 0] == pytest.approx(0.2)
    assert at.query_params["k1"].startswith("4,0;0,0")
    for raw, words in (("1,x;" + ";".join(["0,0"] * 5), "not a number"), ("1,0", "6 x 2"), ([[np.inf, 0]] * 6, "infinite"), ([[1e300, 0]] * 6, "beyond"),
                       ([[None, 0]] * 6, "blank")):
        at.session_state["multi_head.q1.typed"] = raw
        at.run()
        assert not at.exception and any(words in w.value for w in at.warning)
        assert at.query_params["q1"] == ";".join(["0,0"] * 5 + ["1,0"])   # the last good matrix stays


# --- every impulse response side by side, and the nearby-window head -----------------------------


def stems(at):
    """The titles of the stem charts (every vega-lite chart whose layers draw bars and points)."""
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    return [sp["title"] for sp in specs if "layer" in sp and isinstance(sp["layer"][0]["mark"], dict)
            and sp["layer"][0]["mark"].get("type") == "bar"]


def test_all_four_impulse_responses_side_by_side(page):
    titles = stems(page)
    side_by_side = ["head 1: first-sample hold", "head 2: unit delay z⁻¹", "head 3: identity", "head 4: growing box"]
    assert titles[-4:] == side_by_side                  # four stems at once, besides the opened head's
    table = table_headed(page, "impulse response").set_index("impulse response")
    assert list(table.index) == side_by_side
    Q, K = heads.lesson_heads(6, 2, 3.0)
    A = ref.softmax(ref.scaled_scores(Q, K, ref.causal_mask(6)))          # (4, 6, 6)
    np.testing.assert_allclose(table.to_numpy(float), A[:, 3, :], atol=6e-5)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, atol=3e-4)        # each filter's taps sum to 1
    assert table.loc["head 4: growing box"].tolist() == [0.25, 0.25, 0.25, 0.25, 0.0, 0.0]


def test_the_row_slider_and_the_head_count_move_the_side_by_side_stems():
    at = run()
    at.slider(key="multi_head.row").set_value(6).run()
    table = table_headed(at, "impulse response")
    assert np.allclose(table.iloc[3, 1:].to_numpy(float), 1 / 6, atol=1e-4)   # the growing box at row 6
    at.number_input(key="multi_head.H").set_value(6).run()
    assert len(stems(at)) == 1 + 6 and len(table_headed(at, "impulse response")) == 6


def test_the_nearby_window_head_attends_to_the_tokens_around_the_query():
    at = run(p1="nearby", open="1", row="4")
    check_heads(at, presets={1: "nearby"}, open_head=1)
    row = table_headed(at, "impulse response").iloc[0, 1:].to_numpy(float)
    assert row.argmax() == 3 and row[2] > row[1] > row[0] and row[4:].sum() == 0   # causal: the left half
    assert row[2:4].sum() > 0.9                                                     # mostly t and t - 1
    at.toggle(key="multi_head.causal").set_value(False).run()
    row = table_headed(at, "impulse response").iloc[0, 1:].to_numpy(float)
    assert row.argmax() == 3 and abs(row[2] - row[4]) < 1e-4 and row[2] > 0.2       # symmetric window
    narrow = at.slider(key="multi_head.g1").set_value(9.0).run()
    row9 = table_headed(narrow, "impulse response").iloc[0, 1:].to_numpy(float)
    assert row9[3] > row[3] and row9[2] < row[2]                                    # a larger gain: narrower


# --- predict, then see: where the previous-token head looks; heads told positions by hand ----------


def grids(at):
    return [c for c in charts(at) if c.kind == "grid"]


def test_opening_one_head_waits_for_the_opening_question():
    """Before the answer: the head and row controls are disabled and no map is drawn; after it, the
    grid of every head's map is there and the controls move the opened row."""
    q = questions.opening("multi_head")
    at = open_page(PAGE, answered=False)
    assert not at.exception
    assert at.selectbox(key="multi_head.open").disabled and at.slider(key="multi_head.row").disabled
    assert grids(at) == [] and "Row 4 of head 4" not in markdown(at)
    assert any("answered the question" in i.value for i in at.info)
    answer_question(at, q, q.options[q.answer])
    assert not at.selectbox(key="multi_head.open").disabled and not at.slider(key="multi_head.row").disabled
    assert len(grids(at)) == 1
    at.selectbox(key="multi_head.open").set_value(2)
    at.slider(key="multi_head.row").set_value(5).run()
    check_heads(at, open_head=2, row=5)


def shown_row(at, head, t):
    """The weights of row ``t`` of head ``head`` as the page prints them."""
    found = re.search(rf"Row {t} of head {head}: `\[([^\]]*)\]`", markdown(at))
    return np.array([float(w) for w in found[1].split(",")])


def test_the_opening_answer_is_the_row_the_page_shows():
    """The option marked right is where row t of the previous-token head puts most of its weight,
    read off the page once the head is opened at that row."""
    q = questions.opening("multi_head")
    at = run(open=str(PREVIOUS_HEAD), row=str(QUERY_T))
    check_heads(at, open_head=PREVIOUS_HEAD, row=QUERY_T)
    row = shown_row(at, PREVIOUS_HEAD, QUERY_T)
    t = QUERY_T
    if np.allclose(row[:t], 1 / t, atol=1e-4):
        shown = f"Positions 1 to {t} equally"
    else:
        shown = f"Position {int(np.argmax(row)) + 1}, "            # counted from 1, as the options are
    assert q.options[q.answer].startswith(shown)
    assert row[t - 2] > 0.5 and row[t:].sum() == 0                 # most of the weight, nothing later


@pytest.mark.parametrize("link, told", [
    ({}, "2, 3"),                                        # the lesson's previous-token and self heads
    ({"p2": "uniform"}, "3"),
    ({"p1": "nearby", "p3": "first_token"}, "1, 2"),
    ({"H": "8", "p6": "two_positions"}, "2, 3, 7"),      # heads 5..8 repeat the four; 6 is no longer positional
    ({"p2": "first_token", "p3": "custom"}, "none"),
    ({"d_k": "1"}, "none"),                              # too narrow for a circle: zero queries and keys instead
])
def test_the_page_names_the_heads_given_positions_by_hand(link, told):
    at = run(**link)
    assert not at.exception
    assert f"Heads given each token's position by hand here: **{told}**" in markdown(at)


def test_the_page_says_positions_are_written_in_by_hand_and_links_the_positional_page(page):
    text = " ".join(markdown(page).split())
    assert "Attention itself has no notion of order" in text
    assert "*given* each token's position by hand" in text
    links = {link.proto.label: link.proto.page for link in page.get("page_link")}
    assert links["Positional encoding: where a model gets positions from"] == "positional"   # beside the text


def test_copied_heads_output_what_they_copy():
    """The copied-heads question's answer, on the page: with H = 8, heads 5 to 8 have the same
    weights, row for row, as heads 1 to 4."""
    q = questions.by_key("multi_head.copied_heads")
    at = run(H="8")
    A = check_heads(at, H=8)
    table = table_headed(at, "t")
    for h in range(1, 5):
        np.testing.assert_array_equal(table[f"head {h + 4}"], table[f"head {h}"])
    np.testing.assert_array_equal(A[4:], A[:4])
    assert q.options[q.answer].startswith("Exactly what heads 1 to 4 output")
    assert not np.allclose(A[0], A[1])                             # and the four differ among themselves


# --- the scores, computed once; the source, what ran -------------------------------------------------

@pytest.mark.parametrize("opened, causal", [(4, True), (2, False)])
def test_the_scores_are_computed_once_per_redraw_and_drawn_as_computed(kernel_calls, opened, causal):
    """One kernel call gives every head's weights and scores; the opened head's heatmap of S is the
    reference's scores of that head's queries and keys."""
    at = run(open=str(opened), causal="1" if causal else "0")
    assert not at.exception and not at.error
    assert kernel_calls == ["attention_with_scores"]
    Q, K = heads.lesson_heads(6, 2, heads.DEFAULT_GAIN)
    want = ref.scaled_scores(Q[opened - 1], K[opened - 1], ref.causal_mask(6) if causal else None)
    drawn = named(heatmaps(at), f"Scores of head {opened}")
    np.testing.assert_array_equal(np.isnan(drawn), ~np.isfinite(want))         # masked cells: blank
    np.testing.assert_allclose(drawn[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-12, atol=1e-12)


def source_names(at) -> list[str]:
    return shown_names(at, "Kernel source")


def test_the_source_names_the_functions_that_ran_and_no_other(page):
    shown = source_names(page)
    assert shown[0] == "core.kernels.cpu.attention_with_scores" and "core.kernels.cpu.scaled_scores" not in shown
    # the lesson's four heads are built by their presets; the other presets do not run
    built = [name.rsplit(".", 1)[1] for name in shown if name.startswith("core.lessons.heads.")]
    assert {"build_head", "first_token", "previous_token", "self_position", "uniform"} <= set(built)
    assert not {"nearby_window", "two_positions", "custom"} & set(built)
    for name in ("row_entropy_bits", "entropy_ceiling_bits", "score_rank", "wide_vs_narrow_score_flops"):
        assert f"core.lessons.analysis.{name}" in shown
    nearby = run(p1="nearby")
    assert "core.lessons.heads.nearby_window" in source_names(nearby)
    assert "core.lessons.heads.first_token" not in source_names(nearby)           # head 1 was its only one
