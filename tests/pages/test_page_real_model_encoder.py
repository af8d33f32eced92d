"""The "A real model" page on its default, the real encoder all-MiniLM-L6-v2: the heads it names, the
sentence similarity it draws, and each control moving them."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import param_counts
from core.lessons import real_model as rm
from core.model import minilm_package
import hub_support
from page_support import heatmaps, open_page, table_named
from source_support import forward_ran, opened_source, softmax_and_gelu, source_names
from minilm_support import PUBLISHED
from ui import real_model_parts as parts
from ui import state

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "real_model.py")


def named(at) -> str:
    (text,) = [md.value for md in at.markdown if md.value.startswith("**Named heads**")]
    return text


def chart(at, title: str) -> np.ndarray:
    """The matrix the heatmap titled ``title`` draws."""
    return heatmaps(at)[title]


def metric(at, label: str) -> float:
    (value,) = [m.value for m in at.metric if m.label == label]
    return float(value.replace(",", ""))


@pytest.fixture(scope="module")
def page(minilm):
    at = open_page(PAGE)
    assert not at.exception and not at.error
    return at


def test_opens_on_the_real_encoder_and_names_its_known_heads(page):
    assert page.radio(key="real_model.which").value == "minilm"
    text = named(page)
    assert "**previous-token** (≥ 0.5): L1H3 1.00" in text
    assert "**next-token** (≥ 0.5): L2H9" in text
    scores = table_named(page, "head")
    assert list(scores.columns) == ["previous-token", "next-token", "[CLS] sink", "[SEP] sink", "broad"]
    assert scores.loc["L2H9", "next-token"] >= 0.5 > scores.loc["L2H9", "previous-token"]
    assert any("`[CLS]`" in md.value and "`[SEP]`" in md.value for md in page.markdown)


def test_draws_the_published_similarities_and_counts_its_parameters(page):
    np.testing.assert_allclose(chart(page, "Cosine similarity"), PUBLISHED, atol=1e-3)
    assert metric(page, "in the checkpoint's tensors") == metric(page, "by the Parameters page's formula") == 22_713_216
    (table,) = [t.value for t in page.table if t.value.index.name == "part"]      # the formula, part by part
    counts = table["parameters"].str.replace(",", "").astype(int)
    formula = param_counts.model_param_count(parts.model_for(minilm_package.MINILM).config)
    assert counts.to_dict() == formula.parts and counts.sum() == 22_713_216
    np.testing.assert_allclose(table["share"].str.rstrip("%").astype(float), 100 * counts / counts.sum(), atol=0.051)


def test_removing_a_head_moves_the_similarity_and_each_control_moves_it():
    at = open_page(PAGE)
    first = metric(at, "largest change in a similarity")
    assert first > 0
    np.testing.assert_allclose(chart(at, "Without L1H1") - chart(at, "Cosine similarity"),
                               chart(at, "After − before"), atol=1e-4)
    at.number_input(key="real_model.head").set_value(3).run()
    second = metric(at, "largest change in a similarity")
    at.radio(key="real_model.how").set_value("mean").run()
    third = metric(at, "largest change in a similarity")
    assert len({first, second, third}) == 3 and not at.error


def test_the_text_moves_the_detector_and_the_sentences_move_the_matrix():
    at = open_page(PAGE)
    before = table_named(at, "head")
    at.text_area(key="real_model.text").set_value("Attention lets every word look at every other word.").run()
    assert not table_named(at, "head").equals(before)
    cosines = chart(at, "Cosine similarity")
    at.text_area(key="real_model.sentences").set_value("A dog runs in the park.\nA puppy plays outside.").run()
    moved = chart(at, "Cosine similarity")
    assert moved.shape == (2, 2) and moved[0, 1] > 0.3
    at.text_area(key="real_model.sentences").set_value("only one sentence").run()
    assert any("Give 2 to 8 sentences" in e.value for e in at.error)
    np.testing.assert_array_equal(chart(at, "Cosine similarity"), moved)      # the last good sentences
    assert cosines.shape == (3, 3)


def test_without_the_package_the_page_says_how_to_install_and_shows_the_decoder(monkeypatch, tmp_path):
    """No package and a Hub that does not have the files (as offline): the install message, and the decoder."""
    monkeypatch.setattr(minilm_package, "DISTRIBUTION", "no-such-package-here")
    hub = hub_support.serve(monkeypatch, tmp_path)
    parts.model_for.clear()
    try:
        at = open_page(PAGE)
        assert not at.exception and not at.error
        assert any(minilm_package.INSTALL in i.value for i in at.info)
        assert table_named(at, "head").shape[1] == 4                  # the decoder's detector
        assert any(m.label == "largest change in a next-token probability" for m in at.metric)
        assert hub.requests                                           # the Hub was asked, and had nothing
    finally:
        hub.close()
        parts.model_for.clear()


def test_on_a_freshly_started_server_the_numpy_formulas_run_and_the_source_shows_them(monkeypatch):
    """While the loops still compile (can_run False), the forward pass runs their NumPy formulas:
    the same named heads and similarities, and the source expander shows the formulas that ran."""
    from core.model import layers
    from ui import real_model_parts

    monkeypatch.setattr(layers, "can_run", lambda *args: False)
    fresh = (real_model_parts.run, real_model_parts.similarity)   # nothing another test computed is reused
    for cached in fresh:
        cached.clear()
    try:
        at = open_page(PAGE)
        assert not at.exception and not at.error
        shown = " ".join(c.value for c in opened_source(at, "Source: the transformer").code)
    finally:
        for cached in fresh:
            cached.clear()
    assert "def _gelu_erf_numpy" in shown and "def _layer_norm_rows_numpy" in shown
    assert "def _gelu_erf_rational" not in shown and "def _layer_norm_rows(" not in shown
    assert "**next-token** (≥ 0.5): L2H9" in named(at)
    np.testing.assert_allclose(chart(at, "Cosine similarity"), PUBLISHED, atol=1e-3)


def test_sentences_longer_than_a_link_carries_are_cut_and_the_page_says_so(minilm):
    at = open_page(PAGE)
    pasted = "\n".join(f"Sentence number {i} says something about the weather today." for i in range(8))
    assert len(pasted) > state.MAX_TEXT
    at.text_area(key="real_model.sentences").set_value(pasted).run()
    assert not at.exception and not at.error
    kept = at.text_area(key="real_model.sentences").value
    assert len(kept) <= state.MAX_TEXT and pasted.startswith(kept)
    assert any(f"The sentences have {len(pasted):,} characters" in w.value and f"at most {state.MAX_TEXT}" in w.value
               for w in at.warning)
    n = len([line for line in kept.splitlines() if line.strip()])
    assert chart(at, "Cosine similarity").shape == (n, n)                  # the kept sentences, compared


def test_an_emoji_the_encoder_does_not_know_is_said_to_be_unknown(minilm):
    at = open_page(PAGE, {"text": "I love 😀 and مرحبا"})
    assert not at.exception and not at.error
    line = " ".join(md.value for md in at.markdown if md.value.startswith("**Tokens**"))
    assert "`[UNK]`" in line and "�" not in line
    assert any("[UNK]" in i.value and "does not have" in i.value for i in at.info)
    assert not any("part of a character" in i.value for i in at.info)     # it cuts characters, not bytes


def test_the_overview_names_the_model_this_page_opens_on(page):
    """The Overview's row for this page names the model the page opens on by default (once it said "a
    pretrained GPT-2-family model" while the page opened a BERT-family encoder)."""
    home = open_page(str(Path(PAGE).parent / "home.py"))
    (said,) = [md.value.split("**A real model** opens", 1)[1] for md in home.markdown
               if "**A real model** opens" in md.value]
    said = said.split(", on your own text")[0].strip()                     # what it opens, before the others
    (caption,) = [c.value for c in page.caption if " layers × " in c.value]
    opened = caption.split(" (")[0]                                        # the model's name, as the page gives it
    kind = "an encoder" if ": an encoder," in caption else "a decoder"
    assert said.startswith(opened)
    assert ("encoder" in said) == (kind == "an encoder")
    assert "GPT-2-family model" not in said


@pytest.mark.parametrize("typed", [" ", "\n\t ", ""])
def test_a_text_with_no_word_is_refused_and_the_last_good_one_stays(minilm, typed):
    """An encoder reads nothing between [CLS] and [SEP] in a blank text: a message, not a traceback,
    and every table keeps the last good text's numbers."""
    at = open_page(PAGE)
    before = table_named(at, "head")
    at.text_area(key="real_model.text").set_value(typed).run()
    assert not at.exception, at.exception
    assert any("no word for the encoder" in e.value or "empty" in e.value for e in at.error), [e.value for e in at.error]
    assert table_named(at, "head").equals(before)


def test_the_source_shows_the_softmax_and_gelu_the_forward_ran_and_no_other(page):
    """all-MiniLM-L6-v2 is wide enough for the tuned softmax and runs the exact GELU: the source shows
    those, as its forward pass records them, and no other softmax or GELU."""
    m = parts.model_for(minilm_package.MINILM)
    ids, _ = rm.fit_context(m.encode(page.text_area(key="real_model.text").value), m.config.n_ctx, keep_last=True)
    ran = forward_ran(m, ids) & softmax_and_gelu()
    assert "core.model.tuned.forward.softmax_rows" in ran and "core.model.multi_head.softmax_rows" not in ran
    assert any("gelu_erf" in name for name in ran) and not any("gelu_tanh" in name for name in ran)
    assert set(source_names(page, "Source: the transformer")) & softmax_and_gelu() == ran
