"""The model pages show the numbers they claim to show: each check recomputes what a table or chart
names (a LayerNorm's input, the sampler's distribution at the chosen temperature, the heads of the
layers a chart's title names) from the model, not from the code that drew it. Each test was checked
against a planted bug (see the docstrings)."""

import numpy as np
import pytest

import test_page_decoder as decoder_page
import test_page_induction as induction_page
import test_page_inside_model as inside_page
from core.kernels import reference
from core.lessons import induction as I
from page_support import heatmaps, table_named


def test_inside_model_layernorm_tables_describe_the_residual_sum():
    """Fails when the walkthrough's LayerNorm step shows the LayerNorm's output as its input, or when
    the residual sum drops the residual: the table's "before" columns must be the statistics of
    ``x + MHA(x)`` (LayerNorm 1) and ``x + FFN(x)`` (LayerNorm 2), taken from the cache's sublayer
    outputs here."""
    at = inside_page.page()
    assert not at.exception and not at.error
    m = inside_page.model()
    cache = inside_page.cache_of(m, 0)
    at_ = lambda name: cache[f"blocks.0.{name}"][0]           # noqa: E731
    ln1, ln2 = inside_page.frames(at, "token")
    r1 = at_("resid_pre") + at_("attn.output")
    r2 = at_("resid_mid") + at_("ffn.output")
    for shown, r in ((ln1, r1), (ln2, r2)):
        np.testing.assert_allclose(shown["mean before"].to_numpy(), r.mean(axis=-1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shown["std before"].to_numpy(), r.std(axis=-1), rtol=1e-5, atol=1e-6)


def _layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def test_inside_model_heatmaps_follow_the_block_formulas():
    """Fails when a walkthrough chart draws another array than its title names (LayerNorm 1's output
    as the residual sum r1, or the FFN's input as its output) or when a residual sum drops the
    residual: each chart is recomputed here from the charts before it, the embeddings and the
    parameters, following the post-norm block r1 = x + MHA(x), x = LN1(r1), r2 = x + FFN(x)."""
    at = inside_page.page()
    at.slider(key="inside_model.layer").set_value(2).run()
    assert not at.exception and not at.error
    m, example = inside_page.model(), 0
    p = {name.removeprefix("blocks.1."): value for name, value in m.params.items() if name.startswith("blocks.1.")}
    eps, maps = m.cfg.ln_eps, heatmaps(at)
    tokens = m.data.X_test[example]
    np.testing.assert_allclose(maps["token embeddings E[tok_t]"], m.params["embed"][tokens], atol=1e-6)
    np.testing.assert_allclose(maps["E[tok_t] + PE_t"], m.params["embed"][tokens] + reference.sinusoidal(
        len(tokens), m.cfg.d_model), atol=1e-5)
    h = inside_page.cache_of(m, example)["blocks.1.resid_pre"][0]    # layer 2's input: layer 1's output
    r1 = maps["r₁ = x + MHA(x)"]
    np.testing.assert_allclose(r1, h + maps["MHA(x)"], atol=1e-5)
    np.testing.assert_allclose(maps["MHA(x)"], maps["concat"] @ p["attn.W_O"] + p["attn.b_O"], atol=1e-5)
    x = maps["LN₁(r₁)"]
    np.testing.assert_allclose(x, _layer_norm(r1, p["ln1.g"], p["ln1.b"], eps), atol=1e-4)
    hidden = maps["relu(x W₁ + b₁)"]
    np.testing.assert_allclose(hidden, np.maximum(x @ p["ffn.W_1"] + p["ffn.b_1"], 0), atol=1e-5)
    np.testing.assert_allclose(maps["FFN(x)"], hidden @ p["ffn.W_2"] + p["ffn.b_2"], atol=1e-5)
    r2 = maps["r₂ = x + FFN(x)"]
    np.testing.assert_allclose(r2, x + maps["FFN(x)"], atol=1e-5)
    np.testing.assert_allclose(maps["the output of layer 2"], _layer_norm(r2, p["ln2.g"], p["ln2.b"], eps),
                               atol=1e-4)


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
    maps = heatmaps(at)
    # the titles name the role only when the score reaches its threshold: find each chart by its head
    left, = [cells for title, cells in maps.items() if title.startswith(f"Layer 1, head {prev_head + 1}: ")]
    right, = [cells for title, cells in maps.items() if title.startswith(f"Layer 2, head {ind_head + 1}: ")]
    np.testing.assert_allclose(left, m.attn[0, 4, prev_head], atol=1e-6)
    np.testing.assert_allclose(right, m.attn[1, 4, ind_head], atol=1e-6)
