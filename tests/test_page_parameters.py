"""The Parameters and cost page: counts on screen match the arrays the core builds."""
from pathlib import Path

import numpy as np
import pytest

from core import encoder
from core.lessons import analysis

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "parameters.py")


def _metrics(at):
    return [m.value for m in at.metric]


def test_page_runs_and_shows_the_attention_count():
    at = open_page(PAGE)
    assert not at.exception
    headings = [h.value for h in at.header]
    assert any("4·d_model²" in h for h in headings) and "One Transformer block" in headings
    assert _metrics(at)[0] == f"{4 * 64 ** 2:,}"                       # default d_model = 64
    # one wide head and H narrow heads: the same FLOPs on screen
    assert _metrics(at)[1] == _metrics(at)[2] == f"{2 * 128 ** 2 * 64:,} FLOPs"
    assert any("FFN holds" in m.value for m in at.markdown)


def test_count_equals_the_sizes_of_the_encoders_attention_arrays():
    at = open_page(PAGE)
    at.slider(key="parameters.d_model").set_value(32)
    at.number_input(key="parameters.heads").set_value(4)
    at.checkbox(key="parameters.bias").check().run()
    assert not at.exception
    params = encoder.init_params(encoder.EncoderConfig(d_model=32, n_heads=4), dtype=np.float64)
    built = sum(params[f"layers.0.{n}"].size for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"))
    assert built == analysis.mha_param_count(32, 4, bias=True) == 4 * 32 ** 2 + 4 * 32
    assert _metrics(at)[0] == f"{built:,}"
    # and the per-head shapes the page tabulates add up to the same
    assert sum(np.zeros(s).size for s in analysis.mha_param_shapes(32, 4, bias=True).values()) == built
    assert any(f"gives {built:,} numbers (equal to" in c.value for c in at.caption)


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def layer(d, d_ff, bias, cross=False):
    """One layer by the formula: attention 4d^2 (+4d), FFN 2 d d_ff (+d_ff + d), LayerNorms 2 * 2d
    (a decoder layer of an encoder-decoder: a second attention and a third LayerNorm)."""
    attention = 4 * d * d + (4 * d if bias else 0)
    return (2 if cross else 1) * attention + 2 * d * d_ff + (d_ff + d if bias else 0) + (3 if cross else 2) * 2 * d


SIZES = dict(d=64, H=8, d_ff=256, L=6, V=10_000, T=128, bias=False)   # the page's defaults


def check_counts(at, *, d, H, d_ff, L, V, T, bias, arch="encoder-only", learned=False, lm_head=False, tied=True):
    """Every count on screen, from the formulas (the whole model: our own custom one)."""
    assert not at.exception and not at.error
    assert metric(at, "Attention parameters") == f"{4 * d * d + (4 * d if bias else 0):,}"
    assert metric(at, "One head of width d_model") == f"{2 * T * T * d:,} FLOPs"
    assert metric(at, f"{H} heads of width {d // H}") == f"{2 * T * T * d:,} FLOPs"
    block = layer(d, d_ff, bias)
    text = " ".join(m.value for m in at.markdown)
    assert f"Block total **{block:,}**" in text
    assert f"{L} layers: {L * block:,}; a {V:,} × {d} embedding adds {V * d:,}." in text
    stacks = {"encoder-only": ["encoder"], "decoder-only": ["decoder"], "encoder-decoder": ["encoder", "decoder"]}[arch]
    total = V * d + (len(stacks) * T * d if learned else 0) + (V * d if lm_head and not tied else 0)
    total += L * (layer(d, d_ff, bias, cross=False) if arch != "encoder-decoder" else
                  layer(d, d_ff, bias) + layer(d, d_ff, bias, cross=True))
    assert metric(at, "Our count") == f"{total:,}"
    parts = next(df.value for df in at.dataframe if "part" in df.value.columns)["part"].tolist()
    assert all(any(p.startswith(stack) for p in parts) for stack in stacks)
    assert ("decoder cross-attention" in parts) == (arch == "encoder-decoder")


@pytest.mark.parametrize("widget, key, value, changes", [
    ("slider", "parameters.d_model", 128, dict(d=128)),
    ("number_input", "parameters.heads", 4, dict(H=4)),
    ("slider", "parameters.d_ff", 512, dict(d_ff=512)),
    ("slider", "parameters.layers", 3, dict(L=3)),
    ("number_input", "parameters.vocab", 5000, dict(V=5000)),
    ("slider", "parameters.T", 64, dict(T=64)),
    ("checkbox", "parameters.bias", True, dict(bias=True)),
    ("radio", "p_custom_arch", "decoder-only", dict(arch="decoder-only")),
    ("radio", "p_custom_arch", "encoder-decoder", dict(arch="encoder-decoder")),
    ("radio", "p_custom_pos", "learned", dict(learned=True)),
    ("checkbox", "p_custom_lm", True, dict(lm_head=True)),            # tied to the embedding: + 0
])
def test_each_size_moves_the_counts_as_the_formulas_say(widget, key, value, changes):
    at = open_page(PAGE)
    check_counts(at, **SIZES)
    getattr(at, widget)(key=key).set_value(value).run()
    check_counts(at, **{**SIZES, **changes})


def test_an_untied_output_projection_adds_the_vocabulary_times_d_model():
    at = open_page(PAGE)
    at.checkbox(key="p_custom_lm").check().run()
    at.checkbox(key="p_custom_tied").uncheck().run()
    check_counts(at, **SIZES, lm_head=True, tied=False)
    at.radio(key="p_custom_pos").set_value("learned").run()
    at.slider(key="parameters.T").set_value(32).run()
    check_counts(at, **{**SIZES, "T": 32}, lm_head=True, tied=False, learned=True)


def test_every_divisor_is_tabulated_with_a_flat_count():
    at = open_page(PAGE)
    at.slider(key="parameters.d_model").set_value(48).run()
    at.number_input(key="parameters.heads").set_value(6).run()
    sweep = at.dataframe[1].value
    assert sweep["H"].tolist() == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert (sweep["d_k"] * sweep["H"] == 48).all()
    assert sweep["parameters"].nunique() == 1 and sweep["parameters"].iloc[0] == 4 * 48 ** 2


def test_a_head_count_that_does_not_divide_gives_a_message():
    at = open_page(PAGE)
    at.number_input(key="parameters.heads").set_value(7).run()
    assert not at.exception
    assert at.error and "cannot be split evenly into 7 heads" in at.error[0].value
    assert "1, 2, 4, 8, 16, 32, 64" in at.error[0].value


def test_presets_show_our_count_next_to_the_published_one():
    at = open_page(PAGE)
    for key, spec in analysis.MODEL_PRESETS.items():
        at.selectbox(key="parameters.preset").set_value(key).run()
        assert not at.exception
        ours = analysis.model_param_count(spec).total
        values = _metrics(at)
        assert f"{ours:,}" in values and f"{spec.published_total / 1e6:.0f}M" in values
        assert abs(ours - spec.published_total) / spec.published_total < 0.03
    # untie the Transformer's output projection: the count grows by V·d and the page says why
    at.selectbox(key="parameters.preset").set_value("transformer_base").run()
    at.checkbox(key="p_transformer_base_tied").uncheck().run()
    untied = analysis.model_param_count(analysis.TransformerSpec(
        **{**analysis.TRANSFORMER_BASE.__dict__, "tied_output": False})).total
    assert f"{untied:,}" in _metrics(at)
    assert untied - analysis.model_param_count(analysis.TRANSFORMER_BASE).total == 37000 * 512
    assert any("no longer describes" in c.value for c in at.caption)
    at.radio(key="p_transformer_base_arch").set_value("decoder-only").run()
    assert not at.exception
    decoder_only = analysis.model_param_count(analysis.TransformerSpec(**{
        **analysis.TRANSFORMER_BASE.__dict__, "tied_output": False, "architecture": "decoder-only",
        "n_encoder_layers": 0}))
    assert metric(at, "Our count") == f"{decoder_only.total:,}"
    assert decoder_only.total < untied                                 # one stack instead of two


def test_a_link_restores_the_sizes_and_the_preset_and_changes_are_written_back():
    at = open_page(PAGE, {"d_model": "96", "heads": "12", "d_ff": "384", "layers": "3", "vocab": "5000",
                          "T": "32", "bias": "1", "preset": "bert_base"})
    assert not at.exception and not at.error and not at.warning
    assert at.slider(key="parameters.d_model").value == 96 and at.number_input(key="parameters.heads").value == 12
    assert at.checkbox(key="parameters.bias").value and at.selectbox(key="parameters.preset").value == "bert_base"
    assert _metrics(at)[0] == f"{4 * 96 ** 2 + 4 * 96:,}"
    at.slider(key="parameters.layers").set_value(5).run()
    assert at.query_params["layers"] == "5" and at.query_params["d_model"] == "96"
    at.slider(key="parameters.layers").set_value(6).run()            # back to the default: left out
    assert "layers" not in at.query_params


def test_a_bad_link_is_a_warning_and_the_defaults():
    at = open_page(PAGE, {"heads": "0", "preset": "gpt-9",
                          "d_model": "50"})                           # d_model off the slider's steps of 8
    assert not at.exception and at.warning
    assert at.number_input(key="parameters.heads").value == 8
    assert at.selectbox(key="parameters.preset").value == "custom"
    assert at.slider(key="parameters.d_model").value == 48
