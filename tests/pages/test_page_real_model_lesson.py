"""The lesson on "A real model": its opening question locks the head maps until answered and its answer
is what the page then shows; the sentences that depend on a model's scores say what those scores
show; one name for a head everywhere (papers' names only in tooltips); the notation card's symbols."""
import re
from pathlib import Path

import numpy as np
import pytest

from core import pretrained
from core.lessons import notation, questions
from core.lessons import real_model as rm
from core.model import config as C
from core.model import presets
from core.model import transformer as tr
from core.recording import Record
from page_support import answer_question, heatmap_grids, heatmaps, open_page, table_named
from ui import real_model_parts as parts

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "real_model.py")
DECODER = {"which": "tiny_gpt", "text": "the query and the key give a score. the query and the key"}
OPENING = questions.opening("real_model")
SHIPPED = str(Path(tr.__file__).parent / "tiny_gpt")


@pytest.fixture
def link(request):
    """The page's link: ``{}`` opens the encoder (which needs its package), DECODER the shipped GPT."""
    if not request.param:
        request.getfixturevalue("minilm")
    return request.param


def head_inputs(at):
    return [at.number_input(key="real_model.layer"), at.number_input(key="real_model.head")]


def head_maps(at) -> dict:
    return {title: m for title, m in heatmaps(at).items() if title.endswith(": attention weights")}


def everything_said(at) -> list[str]:
    """Every text a visitor reads on the page: markdown, captions, notes, headers, chart titles and the
    head names of the score table."""
    said = [e.value for kind in (at.markdown, at.caption, at.info, at.warning, at.header, at.subheader)
            for e in kind]
    said += list(heatmaps(at)) + [title for grid in heatmap_grids(at) for title in grid]
    said += list(table_named(at, "head").index)
    return said


# ----------------------------------------------------------------------------------------------
# the opening question: which architecture can have a next-token head
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link", [{}, DECODER], ids=["encoder", "decoder"], indirect=True)
def test_the_head_maps_and_the_choice_of_a_head_wait_for_the_answer(link):
    at = open_page(PAGE, link, answered=False)
    assert not at.exception
    assert all(box.disabled for box in head_inputs(at))
    assert not head_maps(at) and not heatmap_grids(at)                  # no map shows the answer yet
    assert not any(title.endswith(" score") for title in heatmaps(at))   # nor any score
    assert not any(d.value.columns[0] == "head" for d in at.dataframe if len(d.value.columns))
    assert not any(md.value.startswith("**Named heads**") for md in at.markdown)
    wrong = next(o for i, o in enumerate(OPENING.options) if i != OPENING.answer)
    answer_question(at, OPENING, wrong)
    assert all(box.disabled for box in head_inputs(at))                 # a hint, still locked
    answer_question(at, OPENING, OPENING.options[OPENING.answer])
    assert not at.exception
    assert not any(box.disabled for box in head_inputs(at))
    assert len(head_maps(at)) == 1 and len(heatmap_grids(at)) == 1
    assert table_named(at, "head").shape[0] == len(heatmap_grids(at)[0])  # a score for every head
    at.number_input(key="real_model.head").set_value(2).run()
    assert list(head_maps(at)) == ["L1H2: attention weights"]


def test_the_opening_answer_is_what_the_encoder_and_the_decoder_show(minilm):
    """The answer follows from the page's own numbers: the encoder's score table has a head whose mean
    weight on the next token reaches the detector's threshold, and every map of the decoder is exactly
    0 above its diagonal."""
    encoder = open_page(PAGE)
    encoder_can = bool(table_named(encoder, "head")["next-token"].max() >= rm.THRESHOLDS["next-token"])
    (grid,) = heatmap_grids(encoder)
    assert max(np.triu(m, 1).sum(axis=1).max() for m in grid.values()) > 0.5   # its maps do look ahead
    decoder = open_page(PAGE, DECODER)
    (grid,) = heatmap_grids(decoder)
    maps = [*grid.values(), *head_maps(decoder).values()]
    decoder_can = any(np.triu(m, 1).max() > 0 for m in maps)
    truth = {(True, False): "Only the encoder", (False, True): "Only the decoders", (True, True): "Both",
             (False, False): "Neither"}[(encoder_can, decoder_can)]
    assert OPENING.options[OPENING.answer].startswith(truth)


def test_the_opening_answer_follows_the_architectures_masks():
    """The encoder reads both ways and GPT-2 causally: the answer is computed from their configs, so a
    decoder whose mask let it look ahead would change it."""
    from core.lessons.questions import real_model as q

    assert not presets.encoder_classifier().causal and presets.gpt2().causal
    assert q._reads_the_next_token(False) and not q._reads_the_next_token(True)


# ----------------------------------------------------------------------------------------------
# the rollout question ("Your turn")
# ----------------------------------------------------------------------------------------------
def test_the_rollout_question_is_asked_under_the_rollout_and_its_answer_is_the_formulas():
    from core.lessons.questions import real_model as q

    (p,) = [p for p in questions.of_page("real_model") if p.key == "real_model.rollout_share"]
    # by hand: each layer is half "one token back", half identity, and the rollout multiplies them
    T, t = q.ROLL_T, q.ROLL_TOKEN - 1
    back = np.eye(T, k=-1)
    back[0, 0] = 1.0
    mixed = 0.5 * back + 0.5 * np.eye(T)
    assert p.answer == pytest.approx((mixed @ mixed)[t, t], abs=1e-12)
    assert f"{(mixed @ mixed)[t, t - 1]:g} reaches token {q.ROLL_TOKEN - 1}" in p.why
    at = open_page(PAGE, DECODER)
    said = [md.value for md in at.markdown]
    (asked,) = [i for i, text in enumerate(said) if p.prompt in text]
    assert asked > next(i for i, text in enumerate(said) if text.startswith("**Named heads**"))


# ----------------------------------------------------------------------------------------------
# sentences computed from the scores
# ----------------------------------------------------------------------------------------------
def shipped_note(at) -> str:
    (note,) = [i.value for i in at.info if "small GPT shipped" in i.value]
    return note


def test_the_shipped_models_note_names_the_heads_its_detector_finds():
    at = open_page(PAGE, DECODER)
    table = table_named(at, "head")
    previous = [h for h in table.index if table.loc[h, "previous-token"] >= rm.THRESHOLDS["previous-token"]]
    induction = [h for h in table.index if table.loc[h, "induction"] >= rm.THRESHOLDS["induction"]]
    assert previous and induction
    note = shipped_note(at)
    (prev_said,) = re.findall(r"a head on the previous token \(([^)]*)\)", note)
    (ind_said,) = re.findall(r"last time \(induction\) \(([^)]*)\)", note)
    assert sorted(prev_said.split(", ")) == sorted(previous)
    assert sorted(ind_said.split(", ")) == sorted(induction)


def test_the_shipped_models_note_claims_no_head_its_detector_does_not_find(monkeypatch):
    """Once the note said its heads "do find the previous token and copy what followed it", whatever the
    scores: with every score under its threshold it must say the detector names no such head."""
    m = pretrained.load(SHIPPED)
    cfg = m.config
    low = {kind: np.full((cfg.n_layers, cfg.n_heads), 0.1) for kind in rm.HEAD_KINDS}
    monkeypatch.setattr(parts, "decoder_detector", lambda _m, source: (low, Record()))   # scores, what ran
    at = open_page(PAGE, DECODER)
    assert not at.exception
    note = shipped_note(at)
    assert "names neither a previous-token head nor an induction head" in note
    assert "finds" not in note and not re.search(r"L\d+H\d+", note)


def sink_count(at) -> int:
    (text,) = [md.value for md in at.markdown if "put half their weight or more on [CLS] or on [SEP]" in md.value]
    return int(re.search(r"On this text (\d+) of the (\d+) heads", text).group(1))


def test_the_number_of_heads_on_cls_or_sep_is_the_score_tables(minilm):
    at = open_page(PAGE)
    counts = []
    for text in ("The cat sat on the mat. The cat sat on the mat.", "Attention lets every word look at every other."):
        at.text_area(key="real_model.text").set_value(text).run()
        table = table_named(at, "head")                                   # rounded to 3 decimals
        at_least = lambda s: int(((table["[CLS] sink"] >= s) | (table["[SEP] sink"] >= s)).sum())  # noqa: E731
        assert at_least(0.5005) <= sink_count(at) <= at_least(0.4995)
        counts.append(sink_count(at))
    assert counts[0] != counts[1]                                             # the number is the text's
    said = " ".join(md.value for md in at.markdown)
    assert "hypothesis" in said and "nothing to do" not in said           # a reading, not a finding


# ----------------------------------------------------------------------------------------------
# GPT-2 small: the heads Wang et al. (2022) name, with the scores measured here
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_shaped(tmp_path_factory):
    """A random model with GPT-2 small's 12 layers of 12 heads (narrow, the shipped tokenizer)."""
    folder = tmp_path_factory.mktemp("gpt2_shaped")
    shipped = pretrained.load(SHIPPED)
    cfg = presets.gpt2(vocab_size=shipped.config.vocab_size, n_ctx=64, d_model=24, n_heads=12, n_layers=12)
    pretrained.save(C.init_params(cfg, seed=7), cfg, str(folder), tokenizer=shipped.tokenizer)
    return pretrained.load(str(folder), np.float32)


def open_as_gpt2(monkeypatch, model, name: str):
    real = parts.model_for
    monkeypatch.setattr(parts, "model_for", lambda source, *rest: model if source == name else real(source, *rest))
    for cached in (parts.run, parts.decoder_detector):
        cached.clear()
    return open_page(PAGE, {"which": "other", "model": name, "text": DECODER["text"]})


@pytest.mark.parametrize("name", rm.GPT2_SMALL)
def test_gpt2s_published_heads_are_wangs_with_the_scores_this_page_measures(monkeypatch, gpt2_shaped, name):
    try:
        at = open_as_gpt2(monkeypatch, gpt2_shaped, name)
        assert not at.exception and not at.error
        table = table_named(at, "head")
        (caption,) = [c for c in at.caption if "Wang et al. (2022)" in c.value]
    finally:
        parts.run.clear()
        parts.decoder_detector.clear()
    said = dict(re.findall(r"(L\d+H\d+) \((\d\.\d\d) here\)", caption.value))
    assert list(said) == ["L3H3", "L5H12", "L6H6", "L7H10"]                # 2.2, 4.11, 5.5, 6.9 from 0
    kinds = {"L3H3": "previous-token", "L5H12": "previous-token", "L6H6": "induction", "L7H10": "induction"}
    for head, score in said.items():
        assert float(score) == pytest.approx(table.loc[head, kinds[head]], abs=0.006)
    plain = re.sub(r" \(\d\.\d\d here\)", "", caption.value)
    assert "previous-token heads L3H3 and L5H12 and induction heads L6H6 and L7H10" in plain
    assert "Olsson" not in caption.value
    for ours, papers in (("L3H3", "2.2"), ("L5H12", "4.11"), ("L6H6", "5.5"), ("L7H10", "6.9")):
        assert f"{ours} = {papers}" in caption.proto.help
        assert not re.search(rf"(?<![\d.]){re.escape(papers)}(?!\d)", caption.value)   # only in the tooltip


def test_no_other_decoder_is_said_to_have_gpt2s_heads(monkeypatch, gpt2_shaped):
    at = open_page(PAGE, DECODER)
    assert not at.exception and table_named(at, "head").shape[1] == 4      # the whole detector drawn
    assert not any("Wang et al." in c.value for c in at.caption)
    try:
        at = open_as_gpt2(monkeypatch, gpt2_shaped, "distilgpt2")            # GPT-2's shape, another model
    finally:
        parts.run.clear()
        parts.decoder_detector.clear()
    assert not at.exception and table_named(at, "head").shape == (144, 4)
    assert not any("Wang et al." in c.value for c in at.caption)


# ----------------------------------------------------------------------------------------------
# one name for a head, and the notation card's symbols
# ----------------------------------------------------------------------------------------------
HEAD_NAME = re.compile(r"\bL(\d+)H(\d+)\b")


@pytest.mark.parametrize("link", [{}, DECODER], ids=["encoder", "decoder"], indirect=True)
def test_every_head_is_named_one_way_counted_from_one(link):
    at = open_page(PAGE, link)
    (caption,) = [c.value for c in at.caption if " layers × " in c.value]
    L, H = map(int, re.search(r"(\d+) layers × (\d+) heads", caption).groups())
    said = everything_said(at)
    for text in said:
        assert not re.search(r"L\d+H\d+\s*\(\d+\.\d+\)", text), text        # no "L1H3 (0.2)"
        for layer, head in HEAD_NAME.findall(text if text != notation.HEAD_NAMES else ""):   # its example aside
            assert 1 <= int(layer) <= L and 1 <= int(head) <= H, text        # counted from 1
    (named,) = [md for md in at.markdown if md.value.startswith("**Named heads**")]
    names_said = HEAD_NAME.findall(named.value)
    assert names_said
    for layer, head in names_said:                                            # each one's papers' name, in its tooltip
        assert f"L{layer}H{head} = {int(layer) - 1}.{int(head) - 1}" in named.proto.help
    assert not re.search(r"\d+\.\d+ \d\.\d\d", named.value)                 # no 0-based name beside a score
    assert sum("counted from 1" in text for text in said) == 1              # the convention, stated once


@pytest.mark.parametrize("link", [{}, DECODER], ids=["encoder", "decoder"], indirect=True)
def test_the_formulas_use_the_notation_cards_symbols(link):
    """x for the residual stream (h is a head's index only), z for the logits only, W_O never W^O."""
    at = open_page(PAGE, link)
    formulas = [e.value for e in at.latex]
    words = [e.value for kind in (at.markdown, at.caption) for e in kind]
    assert formulas
    for f in formulas:
        assert not re.search(r"\bh\s*\\leftarrow|\bh_t\b|\bh_\\ell|\(h\)|\bh\)", f), f
        assert "W^O" not in f and "W^{O}" not in f
        assert "logits" not in f                                             # the logits are z
    assert not any("W^O" in w for w in words)
