"""What every checkpoint family shares (core.model.pretrained): the folder, safetensors, config.json's
model_type looked up among the registered formats, the tokenizer, the Hub; a random GPT-2 saved by
`transformers` stands in for any checkpoint. Each family's own names and layouts are tested beside
its format, in tests/model/formats/."""
import json
import os
import shutil

import numpy as np
import pytest

import hub_support
from core import limits, pretrained
from core.model import formats
from core.training import make_tiny_gpt
from oracle_support import TINY_GPT2 as TINY, random_gpt2, require


TEXTS = ["the query and the key give a score.", "Hello, world!  Ünïcode: naïve café — 東京 🙂",
         "  leading spaces and\ttabs\nnew lines", "a"]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    with open(make_tiny_gpt.CORPUS, encoding="utf-8") as f:
        tok = make_tiny_gpt.train_tokenizer(f.read(), vocab_size=300)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_tokenizer_gives_transformers_ids(tokenizer_file, tmp_path):
    transformers = require("transformers")
    random_gpt2({**TINY, "vocab_size": 300}, seed=3).save_pretrained(tmp_path, safe_serialization=True)
    shutil.copy(tokenizer_file, tmp_path / "tokenizer.json")
    m = pretrained.load(str(tmp_path))
    fast = transformers.GPT2TokenizerFast(tokenizer_file=tokenizer_file)
    for text in TEXTS:
        ids = m.encode(text)
        assert ids.tolist() == fast(text)["input_ids"], text
        assert m.decode(ids) == fast.decode(ids.tolist()) == text
    assert "".join(m.tokens(m.encode(TEXTS[0]))) == TEXTS[0]


# ----------------------------------------------------------------------------------------------
# bad input: a clear ValueError, nothing loaded
# ----------------------------------------------------------------------------------------------
def copy_of(folder, tmp_path, drop=()):
    for name in os.listdir(folder):
        if name not in drop:
            shutil.copy(os.path.join(folder, name), tmp_path / name)
    return str(tmp_path)


def test_a_folder_without_config_or_weights(hf_folder, tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        pretrained.load(copy_of(hf_folder[0], tmp_path / "", drop=("config.json",)))


def test_a_folder_without_weights(hf_folder, tmp_path):
    with pytest.raises(ValueError, match="no model.safetensors"):
        pretrained.load(copy_of(hf_folder[0], tmp_path, drop=("model.safetensors",)))


def test_pickled_weights_are_refused_unopened(hf_folder, tmp_path):
    folder = copy_of(hf_folder[0], tmp_path, drop=("model.safetensors",))
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(b"\x80\x04 this would be unpickled: never")
    with pytest.raises(ValueError, match="pickled"):
        pretrained.load(folder)


def test_a_config_of_another_family(hf_folder, tmp_path):
    folder = copy_of(hf_folder[0], tmp_path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "t5", "d_model": 16}, f)
    with pytest.raises(ValueError, match="t5 model: only the GPT-2 family .* and the BERT family") as refused:
        pretrained.load(folder)
    for model_type in formats.FORMATS:                                   # every registered family is named
        assert f"model_type {model_type!r}" in str(refused.value), model_type


def test_a_bert_config_beside_gpt2_weights(hf_folder, tmp_path):
    folder = copy_of(hf_folder[0], tmp_path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "bert", "hidden_size": 16, "num_attention_heads": 4, "num_hidden_layers": 2,
                   "intermediate_size": 64, "vocab_size": 50, "max_position_embeddings": 32}, f)
    with pytest.raises(ValueError, match="not a complete BERT checkpoint"):
        pretrained.load(folder)


def test_a_truncated_safetensors_file(hf_folder, tmp_path):
    folder = copy_of(hf_folder[0], tmp_path)
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match="truncated or damaged"):
        pretrained.load(folder)


def test_missing_folder_and_a_hub_name_the_hub_lacks(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="no folder"):
        pretrained.load("./no/such/folder")
    hub = hub_support.serve(monkeypatch, tmp_path)
    try:
        with pytest.raises(ValueError, match="put the checkpoint in a folder"):
            pretrained.load("gpt2")
    finally:
        hub.close()


def test_a_hub_name_is_fetched_through_the_size_cap_and_the_setting(tokenizer_file, monkeypatch, tmp_path):
    require("transformers")
    folder = tmp_path / "checkpoint"
    random_gpt2({**TINY, "vocab_size": 300}, seed=3).save_pretrained(folder, safe_serialization=True)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    hub = hub_support.serve(monkeypatch, tmp_path)
    try:
        files = {}
        for name in pretrained.HUB_FILES:
            if os.path.exists(os.path.join(folder, name)):
                with open(os.path.join(folder, name), "rb") as f:
                    files[name] = f.read()
        hub.add("someone/tiny-gpt2", files)
        monkeypatch.setenv("ATTENTION_CHECKPOINTS", "gpt2")
        with pytest.raises(ValueError, match="only these Hub checkpoints"):
            pretrained.load("someone/tiny-gpt2")
        assert hub.requests == []                                   # refused before asking the Hub
        monkeypatch.setenv("ATTENTION_CHECKPOINTS", "someone/tiny-gpt2")
        monkeypatch.setattr(limits, "MAX_CHECKPOINT_MB", len(files["model.safetensors"]) / 2e6)
        with pytest.raises(ValueError, match="over this server's limit"):
            pretrained.load("someone/tiny-gpt2")
        assert hub.gets() == 0                                      # no byte downloaded
        monkeypatch.setattr(limits, "MAX_CHECKPOINT_MB", 600)
        m = pretrained.load("someone/tiny-gpt2")
        assert m.source == "someone/tiny-gpt2" and hub.gets("model.safetensors") == 1
        monkeypatch.delenv("ATTENTION_CHECKPOINTS")
        ids = np.array([[1, 5, 9, 2]])
        np.testing.assert_array_equal(m.forward(ids)[0], pretrained.load(str(folder)).forward(ids)[0])
    finally:
        hub.close()


def test_a_server_that_takes_no_checkpoints_still_opens_its_own_models(hf_folder, monkeypatch):
    monkeypatch.setenv("ATTENTION_CHECKPOINTS", "off")
    with pytest.raises(ValueError, match="takes no other checkpoints"):
        pretrained.load(hf_folder[0])
    assert pretrained.load(pretrained.SHIPPED).config.n_layers == 2            # the small GPT that ships


def test_empty_text_and_a_model_without_tokenizer(hf_folder):
    m = pretrained.load(hf_folder[0])
    with pytest.raises(ValueError, match="tokenizer.json"):
        m.encode("hello")


def test_save_writes_only_a_format_that_is_written(hf_folder, tmp_path):
    m = pretrained.load(hf_folder[0])
    with pytest.raises(ValueError, match="written here in the 'gpt2' format, not 'bert'"):
        pretrained.save(m.params, m.config, str(tmp_path / "out"), model_type="bert")
    assert not os.path.exists(tmp_path / "out")


def test_our_safetensors_reader_agrees_with_the_library(hf_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    ours = pretrained._read_safetensors(os.path.join(hf_folder[0], "model.safetensors"))
    theirs = load_file(os.path.join(hf_folder[0], "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name])
        assert ours[name].dtype == theirs[name].dtype
    mixed = {"a": np.arange(6, dtype=np.float16).reshape(2, 3), "b": np.array(2.5), "c": np.ones((0, 4))}
    save_file(mixed, str(tmp_path / "m.safetensors"))
    back = pretrained._read_safetensors(str(tmp_path / "m.safetensors"))
    for name, value in mixed.items():
        np.testing.assert_array_equal(back[name], value)
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
