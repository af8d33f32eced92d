"""The filter-bank page through AppTest: the lesson's Concat and O, the decomposition, W_O presets."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import analysis
from core.lessons import heads, questions
from core.lessons.questions.filter_bank import DENSE_W_O
from core.kernels import reference as ref

from page_support import answer_question, heatmap_grids, heatmaps, open_page

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "filter_bank.py")
CONCAT = [[0, 0, 1, 0], [0, 0, 0.5, 0.5], [0.998277, 0, 1 / 3, 1 / 3], [0.001717, 0.996564, 0.25, 0.25]]
OUTPUT = [[1, 0, -1, 0], [0.5, 0, -0.5, 0.5], [1.331611, 0, -1 / 3, 1 / 3], [0.251717, 0.996564, -0.25, 0.25]]


def run(**link):
    return open_page(PAGE, link)


def frame(at, first_column):
    return next(d.value for d in at.dataframe if list(d.value.columns)[0] == first_column
                and list(d.value.index)[0] == "t1")


@pytest.fixture(scope="module")
def page():
    return run()


def test_lesson_pipeline_numbers_on_screen(page):
    assert not page.exception and not page.error and not page.warning
    assert page.title[0].value == "Concat, W_O and the filter bank"
    np.testing.assert_allclose(frame(page, "h1.1").to_numpy(), CONCAT, atol=1e-6)
    np.testing.assert_allclose(frame(page, "d1").to_numpy(), OUTPUT, atol=1e-6)
    assert float(page.metric[0].value) <= 1e-12                      # sum of terms = Concat W_O
    assert "Channels mixing heads: **d1**" in " ".join(m.value for m in page.markdown)
    assert "O equals Concat (max |O − Concat| = 0.0e+00)" in page.info[0].value


@pytest.mark.parametrize("preset, mixing", [("identity", "none"), ("swap", "none"), ("random", "d1, d2, d3, d4")])
def test_w_o_presets(page, preset, mixing):
    page.selectbox(key="filter_bank.wo").set_value(preset).run()
    assert not page.exception and not page.error
    assert f"Channels mixing heads: **{mixing}**" in " ".join(m.value for m in page.markdown)
    assert float(page.metric[0].value) < 1e-12
    assert page.query_params["wo"] == preset


def test_identity_w_o_gives_concat():
    at = run(wo="identity")
    np.testing.assert_allclose(frame(at, "d1").to_numpy(), CONCAT, atol=1e-6)


def check_block(at, *, wv="lesson", wo="lesson_mixing", seed=0, gain=heads.DEFAULT_GAIN, causal=True,
                W_V=None, W_O=None):
    """Concat and O on screen are the reference's multi-head attention of the lesson's pipeline with
    the W_V, W_O, gain and mask the settings describe."""
    assert not at.exception and not at.error
    pipe = heads.two_head_pipeline(gain=gain)
    if W_V is None:
        W_V = {"lesson": pipe.W_V, "custom": pipe.W_V, "in_order": np.eye(4),
               "random": np.random.default_rng(seed).normal(size=(4, 4))}[wv]   # the page's seeded draw
    if W_O is None:
        W_O = heads.output_projection(wo, 2, 2, seed=seed)
    want = ref.multi_head_attention(pipe.X, pipe.W_Q, pipe.W_K, np.asarray(W_V, float), np.asarray(W_O, float), 2,
                                    ref.causal_mask(4) if causal else None)
    concat, output = frame(at, "h1.1").to_numpy(float), frame(at, "d1").to_numpy(float)
    np.testing.assert_allclose(concat, want["concat"], atol=1e-6)
    np.testing.assert_allclose(output, want["output"], atol=1e-6)
    assert float(at.metric[0].value) < 1e-12                          # the terms still add up
    return concat, output


@pytest.mark.parametrize("key, value, settings", [
    ("wv", "in_order", dict(wv="in_order")),
    ("wv", "random", dict(wv="random")),
    ("wo", "random", dict(wo="random")),
    ("seed", 3, dict(seed=3)),            # moves nothing on its own: see the next case
    ("causal", False, dict(causal=False)),
    ("gain", 6.0, dict(gain=6.0)),
])
def test_each_control_moves_concat_and_output_as_the_formula_says(key, value, settings):
    at = run()
    before = check_block(at)
    widget = {"wv": at.selectbox, "wo": at.selectbox, "seed": at.number_input, "causal": at.toggle,
              "gain": at.slider}[key]
    widget(key=f"filter_bank.{key}").set_value(value).run()
    after = check_block(at, **settings)
    moved = max(np.abs(a - b).max() for a, b in zip(after, before))
    assert moved == 0.0 if key == "seed" else moved > 1e-3
    assert at.query_params[key] == {False: "0", 6.0: "6"}.get(value, str(value))


@pytest.mark.parametrize("what", ["wv", "wo"])
def test_the_seed_draws_the_random_matrices(what):
    at = run(**{what: "random"})
    first = check_block(at, **{what: "random"})
    at.number_input(key="filter_bank.seed").set_value(3).run()
    again = check_block(at, **{what: "random"}, seed=3)
    assert np.abs(again[1] - first[1]).max() > 1e-2


def test_a_link_opens_the_same_block_and_bad_values_fall_back():
    at = run(wv="in_order", causal="0", gain="6", seed="3")
    assert not at.warning
    check_block(at, wv="in_order", causal=False, gain=6.0, seed=3)
    assert dict(at.query_params) == {"wv": "in_order", "causal": "0", "gain": "6", "seed": "3"}
    bad = run(wo="mystery", gain="1e9", WO="1,2")
    assert not bad.exception and bad.warning[0].value.count("Using the default") == 2
    assert any("4 x 4" in w.value for w in bad.warning)


def test_typed_w_o_and_bad_input():
    at = run()
    at.session_state["filter_bank.WO.typed"] = "1,1,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    at.run()
    assert not at.warning and at.query_params["WO"] == "1,1,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    assert "Channels mixing heads: **none**" in " ".join(m.value for m in at.markdown)
    typed_W_O = [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    check_block(at, W_O=typed_W_O)
    for raw, words in (("1,,0,0;0,1,0,0;0,0,1,0;0,0,0,1", "blank"), ([["a"] * 4] * 4, "not a number"),
                       ([[np.nan] * 4] * 4, "NaN"), ([[-np.inf] * 4] * 4, "infinite"), ([[1e300] * 4] * 4, "beyond")):
        at.session_state["filter_bank.WO.typed"] = raw
        at.run()
        assert not at.exception and any(words in w.value for w in at.warning)
        assert at.query_params["WO"] == "1,1,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    at.selectbox(key="filter_bank.wv").set_value("custom").run()
    at.session_state["filter_bank.WV.typed"] = np.eye(4).tolist()
    at.run()
    assert not at.exception and at.query_params["WV"] == "1,0,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    check_block(at, W_V=np.eye(4), W_O=typed_W_O)


def test_channels_mixing_heads_pure():
    assert analysis.channels_mixing_heads(heads.LESSON_MIXING_W_O, 2) == [0]
    assert analysis.channels_mixing_heads(np.eye(4), 2) == []
    assert analysis.channels_mixing_heads(heads.swap_head_blocks(2, 2), 2) == []
    assert analysis.heads_per_channel(np.ones((6, 3)), 3).tolist() == [3, 3, 3]
    assert analysis.channels_mixing_heads(np.array([[1e-12, 1], [1, 0]]), 2, tol=1e-9) == []
    with pytest.raises(ValueError):
        analysis.heads_per_channel(np.ones((5, 4)), 2)
    assert analysis.max_row_sum_error(np.full((3, 4), 0.25)) == 0.0
    np.testing.assert_allclose(analysis.entropy_ceiling_bits(4, causal=False), [2.0] * 4)


# --- predict, then see: is the sum of the terms exact; the QK and OV circuits ----------------------


def deviation(at):
    """The page's max |Σ_h term_h − Concat·W_O|, or None when it is not shown."""
    shown = [m.value for m in at.metric if m.label.startswith("max |Σ_h term_h")]
    return float(shown[0]) if shown else None


def test_the_w_o_preset_and_the_terms_wait_for_the_opening_question():
    q = questions.opening("filter_bank")
    at = open_page(PAGE, answered=False)
    assert not at.exception
    assert at.selectbox(key="filter_bank.wo").disabled
    assert deviation(at) is None and heatmap_grids(at) == []               # the answer is not drawn yet
    assert any("answered the question" in i.value for i in at.info)
    answer_question(at, q, q.options[q.answer])
    assert not at.selectbox(key="filter_bank.wo").disabled
    assert deviation(at) <= 1e-12 and len(heatmap_grids(at)) == 1
    at.selectbox(key="filter_bank.wo").set_value(DENSE_W_O).run()
    check_block(at, wo=DENSE_W_O)


@pytest.mark.parametrize("seed", [0, 3, 41])
def test_the_opening_answer_is_what_the_page_shows_for_a_dense_w_o(seed):
    """With the dense W_O the question names, every output channel reads both heads, and the sum of
    the terms is Concat·W_O to rounding; so it is for every other preset: exact for any W_O."""
    q = questions.opening("filter_bank")
    at = run(wo=DENSE_W_O, seed=str(seed), wv="random")
    check_block(at, wo=DENSE_W_O, wv="random", seed=seed)
    assert "Channels mixing heads: **d1, d2, d3, d4**" in " ".join(m.value for m in at.markdown)
    exact = [deviation(at) <= 1e-12]
    for preset in heads.W_O_PRESETS:
        at.selectbox(key="filter_bank.wo").set_value(preset).run()
        exact.append(deviation(at) <= 1e-12)
    assert q.options[q.answer].startswith("Exactly, for any W_O" if all(exact) else "Only approximately")


@pytest.mark.parametrize("link", [{}, {"wv": "random", "wo": "random", "seed": "3", "gain": "6"}])
def test_the_circuits_are_the_products_of_each_heads_weights_and_each_term_is_its_map_then_its_ov(link):
    """QK circuit of head h = W_Q^h W_K^hᵀ, OV circuit = W_V^h W_O^(h) (head h's columns of W_V, its
    rows of W_O), and term h = A_h X (W_V^h W_O^(h)): recomputed here from the weights."""
    at = run(**link)
    seed, gain = int(link.get("seed", 0)), float(link.get("gain", heads.DEFAULT_GAIN))
    pipe = heads.two_head_pipeline(gain=gain)
    W_V = np.random.default_rng(seed).normal(size=(4, 4)) if link.get("wv") == "random" else pipe.W_V
    W_O = heads.output_projection(link.get("wo", "lesson_mixing"), 2, 2, seed=seed)
    W_O = np.vectorize(lambda x: float(f"{x:.8g}"))(W_O)                   # as the editor holds it
    maps = heatmaps(at)
    A = ref.multi_head_attention(pipe.X, pipe.W_Q, pipe.W_K, W_V, W_O, 2, ref.causal_mask(4))["weights"]
    (grid,) = heatmap_grids(at)
    for h in range(2):
        cols = slice(2 * h, 2 * h + 2)
        qk, ov = pipe.W_Q[:, cols] @ pipe.W_K[:, cols].T, W_V[:, cols] @ W_O[cols]
        np.testing.assert_allclose(maps[f"QK circuit of head {h + 1}"], qk, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(maps[f"OV circuit of head {h + 1}"], ov, rtol=1e-12, atol=1e-12)
        term = grid[f"head {h + 1}: A_{h + 1} X W_V^{h + 1} W_O^({h + 1})"]
        np.testing.assert_allclose(term, A[h] @ pipe.X @ ov, rtol=1e-12, atol=1e-12)
    assert not np.allclose(maps["OV circuit of head 1"], maps["OV circuit of head 2"])


def test_the_mixing_question_is_what_the_page_shows_and_its_summary_waits_for_it():
    """Identity and swap: no channel reads two heads on the page, so the right option is "neither";
    the summary that says so appears only once the question is answered."""
    q = questions.by_key("filter_bank.w_o_mixing")
    at = open_page(PAGE, answered=False)
    opening = questions.opening("filter_bank")
    answer_question(at, opening, opening.options[opening.answer])
    assert not any("With W_O = I" in i.value for i in at.info)
    mixing = {}
    for preset in ("identity", "swap"):
        at.selectbox(key="filter_bank.wo").set_value(preset).run()
        mixing[preset] = " ".join(m.value for m in at.markdown).split("Channels mixing heads: **")[1].split("**")[0]
    assert mixing == {"identity": "none", "swap": "none"}
    assert q.options[q.answer].startswith("No, in neither case")
    answer_question(at, q, q.options[q.answer])
    summary = next(i.value for i in at.info if "With W_O = I" in i.value)
    assert "channels mixing heads: none: each channel" in summary and summary.endswith("channels mixing heads: none.")
