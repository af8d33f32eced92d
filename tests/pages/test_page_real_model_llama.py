"""The "A real model" page on small Llama-family models (random weights, the shipped tokenizer): what it
says about the architecture comes from the config, not the checkpoint's name; grouped-query attention's
table and sizes; a large model's grid one layer at a time; the logit lens through RMSNorm; the
instructor's setting hiding "Another checkpoint". (test_page_real_model_smollm2.py: SmolLM2 itself.)"""
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from core import pretrained
from core.lessons import real_model as rm
from core.model import config as C
from core.model import transformer as tr
from page_support import heatmap_grids, open_page, table_named
from ui import real_model_parts as parts

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "real_model.py")
TEXT = "the query and the key give a score. the query and the key"
SHIPPED = pretrained.load(str(Path(tr.__file__).parent / "tiny_gpt"))
SMALL_LLAMA = C.TransformerConfig(vocab_size=SHIPPED.config.vocab_size, n_ctx=64, d_model=24, n_heads=6, n_kv_heads=2,
                                  d_ff=40, n_layers=3, norm="rmsnorm", norm_placement="pre", activation="silu",
                                  gated_ffn=True, positional="rotary", rope_base=500.0, tied_unembed=True,
                                  final_ln=True, bias=False)
CACHES = ("run", "decoder_detector", "lens", "edited", "generated")


def model_of(cfg, seed=0) -> pretrained.Model:
    params = C.init_params(cfg, seed=seed, dtype=np.float32)
    return pretrained.Model(cfg, params, SHIPPED.tokenizer, "", "llama", sum(v.size for v in params.values()))


def clear_caches():
    for name in CACHES:
        getattr(parts, name).clear()


@pytest.fixture
def serve(monkeypatch):
    """``serve({name: model})``: the page's "Another checkpoint" loads these models by these names
    (nothing computed for another model under the same name is reused)."""
    real = parts.model_for

    def serving(models: dict):
        monkeypatch.setattr(parts, "model_for", lambda source, *rest: models[source] if source in models
                            else real(source, *rest))
        clear_caches()

    yield serving
    clear_caches()


def open_as(name: str, **link):
    return open_page(PAGE, {"which": "other", "model": name, "text": TEXT, **link})


def formulas(at) -> str:
    return "\n".join(e.value for e in at.latex)


def said(at) -> str:
    return "\n".join(e.value for kind in (at.markdown, at.caption) for e in kind)


# ----------------------------------------------------------------------------------------------
# the architecture, from the config
# ----------------------------------------------------------------------------------------------
def test_the_formulas_and_words_follow_the_config_not_the_name(serve):
    """A Llama served under GPT-2's name gets RMSNorm, the gated SiLU network, rotary positions and
    shared key/value heads; a GPT-2-shaped model served under a Llama-sounding name gets LayerNorm and GELU."""
    gpt = model_of(dataclasses.replace(SHIPPED.config))
    serve({"gpt2-medium": model_of(SMALL_LLAMA), "my-llama-3": gpt})
    llama = open_as("gpt2-medium")
    assert not llama.exception and not llama.error
    f = formulas(llama)
    for piece in (r"\mathrm{RMSNorm}_1", r"\mathrm{RMSNorm}_f(x)\, W_E^\top", r"\mathrm{silu}(x W_{\text{gate}}) \odot",
                  r"W_K^{\lceil h / 3 \rceil}", r"500^{-2c / d_k}", r"R_t\, x_t W_Q^{h}"):
        assert piece in f, piece
    assert r"\mathrm{LN}" not in f and "GELU" not in f and "b_1" not in f
    assert "6 query heads share 2 key/value heads" in said(llama) and "base 500" in said(llama)
    assert "3 layers × 6 heads over 2 key/value heads" in said(llama)
    other = open_as("my-llama-3")
    f = formulas(other)
    assert r"\mathrm{LN}_1" in f and r"\mathrm{GELU}(x W_1 + b_1)\, W_2 + b_2" in f
    assert "RMSNorm" not in f and "silu" not in f and "lceil" not in f and "R_t" not in f
    assert "key/value" not in said(other)
    for text in (formulas(llama), formulas(other)):                   # the notation card's symbols
        assert "logits" not in text and "W^O" not in text and not re.search(r"\bh\)|\(h\)", text)


# ----------------------------------------------------------------------------------------------
# grouped-query attention
# ----------------------------------------------------------------------------------------------
def gqa_tables(at):
    return table_named(at, "key/value head"), table_named(at, "grouped-query attention")


@pytest.mark.parametrize("kv", [1, 2, 3])
def test_the_grouped_query_section_shows_the_configs_sharing_and_sizes(serve, kv):
    cfg = dataclasses.replace(SMALL_LLAMA, n_kv_heads=kv)
    m = model_of(cfg)
    serve({"small-llama": m})
    at = open_as("small-llama")
    assert not at.exception
    groups, sizes = gqa_tables(at)
    group = cfg.n_heads // kv
    assert list(groups.index) == [f"K/V {g + 1}" for g in range(kv)]
    assert [cell.split(", ") for cell in groups.iloc[:, 0]] == [
        [f"H{g * group + i + 1}" for i in range(group)] for g in range(kv)]
    want = rm.grouped_query(cfg)
    T = len(m.encode(TEXT))
    held = [{} for _ in range(cfg.n_layers)]
    tr.forward(m.params, cfg, m.encode(TEXT), kv=held)                          # the cache the text fills
    in_cache = sum(layer["K"].nbytes + layer["V"].nbytes for layer in held)
    expected = [(want.attention_params, want.full_attention_params),
                (want.kv_bytes_per_token, want.full_kv_bytes_per_token),
                (in_cache, in_cache * cfg.n_heads // kv), want.kv_bytes(cfg.n_ctx)]
    np.testing.assert_array_equal(sizes.iloc[:, :2].to_numpy(dtype=np.int64), np.array(expected))
    assert sizes.iloc[0, 0] == 24 * 24 * 2 + 2 * 24 * kv * 4 and sizes.iloc[0, 1] == 4 * 24 ** 2
    np.testing.assert_allclose(sizes["ratio"], [(2 + 2 * kv / 6) / 4, kv / 6, kv / 6, kv / 6])
    assert f"({T} tokens)" in sizes.index[2]
    caption = next(c.value for c in at.caption if "Each attention block" in c.value)
    assert f"= {want.attention_params:,} here" in caption and "whatever the head count" not in caption
    assert "3·d·d_ff" in caption


def test_a_model_with_a_key_value_head_per_query_head_has_no_grouped_query_section(serve):
    serve({"full-heads": model_of(dataclasses.replace(SMALL_LLAMA, n_kv_heads=None))})
    at = open_as("full-heads")
    assert not at.exception
    assert not any(h.value == "Grouped-query attention" for h in at.header)
    caption = next(c.value for c in at.caption if "Each attention block" in c.value)
    assert "4·d² whatever the head count" in caption


def test_the_one_head_view_names_the_heads_it_shares_keys_with(serve):
    serve({"small-llama": model_of(SMALL_LLAMA)})
    at = open_as("small-llama", layer="2", head="5")
    assert "L2H5 reads key/value head 2 of its layer, with L2H4 and L2H6" in said(at)


# ----------------------------------------------------------------------------------------------
# every head: a large model's grid shows one layer, picked
# ----------------------------------------------------------------------------------------------
def grid_picker(at):
    return at.select_slider(key="real_model.grid_layer")


def test_a_small_models_grid_shows_every_head_and_a_large_ones_one_layer_picked(serve):
    deep = dataclasses.replace(SMALL_LLAMA, n_layers=17)                     # 102 maps: more than one grid shows
    m = model_of(deep, seed=2)
    small_model = model_of(SMALL_LLAMA)
    serve({"small-llama": small_model, "deep-llama": m})
    small = open_as("small-llama")
    (grid,) = heatmap_grids(small)
    assert len(grid) == 3 * 6 and grid_picker(small).value == parts.EVERY_LAYER     # every layer, to begin with
    assert "every layer" in grid_picker(small).options
    grid_picker(small).set_value(2).run()
    (grid,) = heatmap_grids(small)
    assert list(grid) == [f"L2H{h + 1}" for h in range(6)]
    assert small.query_params["grid_layer"] == "2"
    at = open_as("deep-llama")
    assert "every layer" not in grid_picker(at).options and "grid_layer" not in at.query_params   # layer 1: its default
    _, cache = tr.forward(m.params, deep, m.encode(TEXT))
    n = min(len(m.encode(TEXT)), 16)
    for layer in (1, 17, 9):
        if layer != 1:
            grid_picker(at).set_value(layer).run()
        assert not at.exception
        (grid,) = heatmap_grids(at)
        assert list(grid) == [f"L{layer}H{h + 1}" for h in range(6)]
        for h, drawn in enumerate(grid.values()):
            np.testing.assert_allclose(drawn, cache[f"blocks.{layer - 1}.attn.weights"][0, h, :n, :n], rtol=1e-6)
    assert at.number_input(key="real_model.layer").value == 1            # the one-head view keeps its own layer
    linked = open_as("deep-llama", grid_layer="0")                       # every layer: too many maps here
    assert grid_picker(linked).value == 1 and any("one layer at a time" in w.value for w in linked.warning)


# ----------------------------------------------------------------------------------------------
# the logit lens: RMSNorm, the model's own
# ----------------------------------------------------------------------------------------------
def test_the_logit_lens_reads_the_stream_through_the_models_rmsnorm(serve):
    m = model_of(SMALL_LLAMA, seed=3)
    serve({"small-llama": m})
    at = open_as("small-llama")
    table = table_named(at, "logit lens")
    _, cache = tr.forward(m.params, SMALL_LLAMA, m.encode(TEXT))
    streams = [cache[f"blocks.{l}.resid_pre"][0] for l in range(SMALL_LLAMA.n_layers)]
    x = np.stack(streams + [cache[f"blocks.{SMALL_LLAMA.n_layers - 1}.resid_post"][0]]).astype(np.float64)
    z = m.params["ln_final.g"] * x / np.sqrt((x * x).mean(-1, keepdims=True) + SMALL_LLAMA.ln_eps) @ \
        m.params["embed"].T.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = [[f"{parts.show(t)} ({q:.0%})" for t, q in zip(rm.token_texts(m, p[r].argmax(-1)), p[r].max(-1))]
            for r in range(len(p))]
    assert table.to_numpy().tolist() == want
    assert r"\mathrm{RMSNorm}_f(x_t^{(\ell)})" in formulas(at)
    assert "final norm (RMSNorm)" in said(at)


# ----------------------------------------------------------------------------------------------
# the instructor's setting
# ----------------------------------------------------------------------------------------------
def test_a_server_that_takes_no_other_checkpoint_does_not_offer_one(monkeypatch, minilm):
    monkeypatch.setenv("ATTENTION_CHECKPOINTS", "off")
    linked = open_page(PAGE, {"which": "other", "model": "gpt2", "text": TEXT})      # a link from another server
    assert not linked.exception
    assert linked.radio(key="real_model.which").options == [parts.MODELS[c] for c in ("minilm", "smollm2", "tiny_gpt")]
    assert linked.radio(key="real_model.which").value == parts.DEFAULT_MODEL
    assert any("takes no other checkpoints" in w.value for w in linked.warning)
    assert not any(t.key == "real_model.model" for t in linked.text_input)
    monkeypatch.setenv("ATTENTION_CHECKPOINTS", "gpt2,distilgpt2")
    assert list(parts.offered()) == list(parts.MODELS)                     # a list of names: still offered
    monkeypatch.setenv("ATTENTION_CHECKPOINTS", "any")
    assert list(parts.offered()) == list(parts.MODELS)
