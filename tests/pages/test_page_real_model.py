"""The "A real model" page on the shipped decoder: the numbers it shows, and each control moving them.
(tests/pages/test_page_real_model_encoder.py: the page on the real encoder, its default.)"""
from pathlib import Path

import numpy as np
import pytest

from core import pretrained
from core.model import transformer as tr
from core.model import config as C
from tests.page_support import open_page, table_named

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
