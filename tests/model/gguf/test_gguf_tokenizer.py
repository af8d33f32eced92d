"""The tokenizer built from a GGUF's metadata: the ids transformers' own GGUF tokenizer gives, texts
decoded back unchanged, and a ValueError for a tokenizer that does not fit the model."""
import pytest

from core.model.gguf.file import open_gguf
from core.model.gguf.model import read
from core.model.gguf.tokenizer import pre_tokenizer, tokenizer_from
from gguf_support import random_llama_weights, tiny_tokenizer, write_llama_gguf
from oracle_support import require

TEXTS = ["The year 2024 had 366 days, and 3.14159 is close to pi; call 555-0123 at 10:45.",
         "Café, naïve, résumé, Ünïcödé and 東京: accents and other scripts.",
         "I 🙂 emoji, even joined ones: 👩‍👩‍👧 and 🇫🇷!",
         "def square(x):\n    return x ** 2  # square it\n\n\tprint(square(12345))\n",
         "Line one\r\nLine two\n\n\nend   with spaces   ",
         "  leading spaces, 'quotes', it's don't we'll"]


@pytest.fixture(scope="module")
def both(smollm2_file):
    """Ours, and transformers' tokenizer for the same file."""
    transformers = require("transformers")
    require("gguf")
    import os

    ours = tokenizer_from(open_gguf(smollm2_file).metadata, 49152)
    theirs = transformers.AutoTokenizer.from_pretrained(os.path.dirname(smollm2_file),
                                                        gguf_file=os.path.basename(smollm2_file))
    return ours, theirs


@pytest.mark.parametrize("text", TEXTS)
def test_the_same_ids_as_transformers_and_the_text_back(both, text):
    ours, theirs = both
    ids = ours.encode(text).ids
    assert ids == theirs.encode(text)
    assert ours.decode(ids) == text


def test_smollm_cuts_every_digit_alone_as_llama_cpp_does():
    """llama.cpp's 'smollm' pre-tokenizer: each digit its own piece, then GPT-2's words."""
    pieces = [p for p, _ in pre_tokenizer("smollm").pre_tokenize_str("in 2024, it's")]
    assert pieces == ["in", "Ġ", "2", "0", "2", "4", ",", "Ġit", "'s"]


def test_control_tokens_stay_whole(both):
    ours, theirs = both
    text = "<|im_start|>user\nHello<|im_end|>\n"
    ids = ours.encode(text).ids
    assert ids == theirs.encode(text) and ids[0] == 1 and 2 in ids
    assert ours.decode(ids, skip_special_tokens=False) == text


# ----------------------------------------------------------------------------------------------
# tokenizers that do not fit
# ----------------------------------------------------------------------------------------------
def tiny_metadata(tiny_llama):
    return dict(open_gguf(tiny_llama[0]).metadata)


def test_a_vocabulary_of_another_size_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="has 260 tokens but the model's embedding has 300 rows"):
        tokenizer_from(tiny_metadata(tiny_llama), 300)


def test_a_file_whose_tokens_outnumber_its_embedding_is_refused(tmp_path):
    tokens, merges, types = tiny_tokenizer()
    path = write_llama_gguf(tmp_path / "more.gguf", random_llama_weights(),
                            tokenizer=(tokens + ["extra"], merges, types + [1]))
    with pytest.raises(ValueError, match="261 tokens but the model's embedding has 260 rows"):
        read(path)


def test_a_merge_naming_an_unknown_token_is_refused(tiny_llama):
    meta = tiny_metadata(tiny_llama)
    meta["tokenizer.ggml.merges"] = meta["tokenizer.ggml.merges"] + ["Ġthe ory"]
    with pytest.raises(ValueError, match="Merge 3 .*'Ġthe ory'.* names a token the vocabulary does not have"):
        tokenizer_from(meta, 260)


def test_an_unknown_pre_tokenizer_or_a_sentencepiece_one_is_refused(tiny_llama):
    meta = tiny_metadata(tiny_llama)
    with pytest.raises(ValueError, match="'qwen9' pre-tokenizer, which is not known here"):
        tokenizer_from({**meta, "tokenizer.ggml.pre": "qwen9"}, 260)
    with pytest.raises(ValueError, match="tokenizer is 'llama'; only byte-level BPE"):
        tokenizer_from({**meta, "tokenizer.ggml.model": "llama"}, 260)
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(ValueError, match="no tokenizer.ggml.merges"):
        tokenizer_from(meta, 260)


def test_the_tiny_tokenizer_merges_and_adds_bos_when_asked(tiny_llama):
    meta = tiny_metadata(tiny_llama)
    tok = tokenizer_from(meta, 260)
    assert tok.encode("the the").ids == [1 + ord("t"), 258, 259]       # t, he, Ġthe (byte b is token 1 + b)
    bos = tokenizer_from({**meta, "tokenizer.ggml.add_bos_token": True}, 260)
    assert bos.encode("the").ids == [0] + tok.encode("the").ids
    assert bos.decode(bos.encode("the the").ids) == "the the"
