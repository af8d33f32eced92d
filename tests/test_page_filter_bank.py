"""The filter-bank page through AppTest: the lesson's Concat and O, the decomposition, W_O presets."""
from pathlib import Path

import numpy as np
import pytest

from core import analysis, heads

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "filter_bank.py")
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


def test_value_projections_mask_gain_and_link():
    at = run(wv="in_order", causal="0", gain="6", seed="3")
    assert not at.exception and not at.error and not at.warning
    assert dict(at.query_params) == {"wv": "in_order", "causal": "0", "gain": "6", "seed": "3"}
    at.selectbox(key="filter_bank.wv").set_value("random").run()
    assert not at.exception and float(at.metric[0].value) < 1e-12
    bad = run(wo="mystery", gain="1e9", WO="1,2")
    assert not bad.exception and bad.warning[0].value.count("Using the default") == 2
    assert any("4 x 4" in w.value for w in bad.warning)


def test_typed_w_o_and_bad_input():
    at = run()
    at.session_state["filter_bank.WO.typed"] = "1,1,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    at.run()
    assert not at.warning and at.query_params["WO"] == "1,1,0,0;0,1,0,0;0,0,1,0;0,0,0,1"
    assert "Channels mixing heads: **none**" in " ".join(m.value for m in at.markdown)
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
