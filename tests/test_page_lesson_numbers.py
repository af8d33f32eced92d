"""The model pages show the numbers they claim to show: each check recomputes what a table or chart
names (a LayerNorm's input, the sampler's distribution at the chosen temperature, the heads of the
layers a chart's title names) from the model, not from the code that drew it. Each test was checked
against a planted bug (see the docstrings)."""
import json

import numpy as np
import pytest
from streamlit import dataframe_util

import test_page_decoder as decoder_page
import test_page_induction as induction_page
import test_page_inside_model as inside_page
from core.models import induction as I
from page_support import table_named


def test_inside_model_layernorm_tables_describe_the_residual_sum():
    """Fails when the walkthrough's LayerNorm step shows the LayerNorm's output as its input, or when
    the residual sum drops the residual: the table's "before" columns must be the statistics of
    ``h + MHA(h)`` (LayerNorm 1) and ``x + FFN(x)`` (LayerNorm 2), taken from the cache's sublayer
    outputs here."""
    at = inside_page.page()
    assert not at.exception and not at.error
    m = inside_page.model()
    cache = inside_page.cache_of(m, 0)
    at_ = lambda name: cache[f"layers.0.{name}"][0]           # noqa: E731
    ln1, ln2 = inside_page.frames(at, "token")
    r1 = at_("resid_pre") + at_("attn_out")
    r2 = at_("ln1_out") + at_("ffn_out")
    for shown, r in ((ln1, r1), (ln2, r2)):
        np.testing.assert_allclose(shown["mean before"].to_numpy(), r.mean(axis=-1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shown["std before"].to_numpy(), r.std(axis=-1), rtol=1e-5, atol=1e-6)


def _distribution(at):
    return table_named(at, "token")


def test_decoder_page_samples_at_the_temperature_chosen():
    """Fails when the page passes another temperature to ``generate`` than the one chosen (every
    τ != 0 replaced by 1): without top-k or top-p, the distribution generation sampled from must be
    softmax(z/τ), the bars the page computes from the logits at τ, and it must move with τ."""
    at = decoder_page.page()
    at.run()
    d1 = _distribution(at)
    np.testing.assert_allclose(d1["p sampled from"], d1["p before top-k/top-p"], atol=1e-6)
    for tau in (2.0, 0.5):
        at.number_input(key="decoder.temperature").set_value(tau).run()
        assert not at.error
        d = _distribution(at)
        np.testing.assert_allclose(d["p sampled from"], d["p before top-k/top-p"], atol=1e-6, err_msg=str(tau))
        assert np.abs(d["p sampled from"].to_numpy() - d1["p sampled from"].to_numpy()).max() > 1e-3


def _heatmaps(at) -> dict:
    """Every heatmap's cells by the chart's title: ``{title: (T, T) array}``. Streamlit moves a spec's
    inline ``data.values`` into the element's Arrow data, read back here."""
    found = {}
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if not chart.proto.data.data or not isinstance(spec.get("title"), str):
            continue
        cells = dataframe_util.convert_arrow_bytes_to_pandas_df(chart.proto.data.data)
        if not {"row", "col"} <= set(cells.columns):
            continue
        value = next(column for column in cells.columns if column not in ("row", "col"))
        n_rows = cells["row"].nunique()
        found[spec["title"]] = cells[value].to_numpy(float).reshape(n_rows, -1)
    return found


@pytest.fixture(scope="module")
def induction_numbers():
    setup = I.InductionSetup(steps=induction_page.STEPS)             # the page test's model
    data = I.held_out(setup, 0)
    return data, I.measure(I.train_induction(setup, seed=0).params, setup.config, data)


def test_induction_page_draws_each_layers_best_head(induction_numbers):
    """Fails when a chart draws the other layer's head, or when the best heads are chosen from the
    wrong layers' scores: the heads are recomputed here as layer 1's best previous-token head and
    layer 2's best induction head, and each chart's cells must be that head's map."""
    _, m = induction_numbers
    prev_head, ind_head = int(np.argmax(m.previous[0])), int(np.argmax(m.induction[1]))
    at = induction_page._open(example=4)
    assert not at.exception and not at.error
    maps = _heatmaps(at)
    # the titles name the role only when the score reaches its threshold: find each chart by its head
    left, = [cells for title, cells in maps.items() if title.startswith(f"Layer 1, head {prev_head + 1}: ")]
    right, = [cells for title, cells in maps.items() if title.startswith(f"Layer 2, head {ind_head + 1}: ")]
    np.testing.assert_allclose(left, m.attn[0, 4, prev_head], atol=1e-6)
    np.testing.assert_allclose(right, m.attn[1, 4, ind_head], atol=1e-6)
