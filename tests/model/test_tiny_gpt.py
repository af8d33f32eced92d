"""The shipped tiny model teaches what the real-model page says it does: the page's own head detector
finds a previous-token head and an induction head in it, and it continues a sentence of its
training text in words of that text."""
import os
import re

import pytest

from core import pretrained
from core.lessons import real_model as rm
from core.model.generation import generate
from core.training import make_tiny_gpt

SHIPPED = make_tiny_gpt.OUT
PROMPTS = ("the query and the key give a score.", "an induction head looks for the place where the current token came before.")


@pytest.fixture(scope="module")
def model():
    return pretrained.load(SHIPPED)


def corpus_words() -> set[str]:
    with open(make_tiny_gpt.CORPUS, encoding="utf-8") as f:
        return set(re.findall(r"[a-z]+", f.read().lower()))


def test_the_page_detector_finds_a_previous_token_and_an_induction_head(model):
    m = model
    # exactly the page's call (views/real_model.py)
    scores = rm.detect_heads(m.params, m.config, n=min(20, m.config.n_ctx // 2 - 1),
                             first=m.tokenizer.token_to_id("<|endoftext|>"))
    assert scores["previous-token"].max() >= 0.5, scores["previous-token"]
    assert scores["induction"].max() >= 0.3, scores["induction"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_continues_in_words_of_the_corpus(model, prompt):
    m = model
    assert prompt in open(make_tiny_gpt.CORPUS, encoding="utf-8").read()
    ids = m.encode(prompt)
    new = generate(m.params, m.config, prompt=ids, max_new_tokens=min(30, m.config.n_ctx - len(ids)),
                   temperature=0.0).new_tokens                      # as the page asks: at most the context's room
    words = re.findall(r"[a-z]+", m.decode(new.tolist()).lower())
    known = corpus_words()
    assert len(words) >= 5, words
    assert sum(w in known for w in words) >= 0.8 * len(words), words


def test_the_shipped_folder_is_small_and_in_gpt2_format():
    names = sorted(os.listdir(SHIPPED))
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    assert sum(os.path.getsize(os.path.join(SHIPPED, n)) for n in names) < 3_000_000
    transformers = pytest.importorskip("transformers")
    transformers.GPT2LMHeadModel.from_pretrained(SHIPPED)
