"""Loading and saving GPT-2-format checkpoints, against `transformers` (random weights, no download)."""
import json
import os
import shutil

import numpy as np
import pytest

from core import pretrained
from core.training import make_tiny_gpt
from oracle_support import require
from tests.model.test_transformer import TINY, random_gpt2

TEXTS = ["the query and the key give a score.", "Hello, world!  Ünïcode: naïve café — 東京 🙂",
         "  leading spaces and\ttabs\nnew lines", "a"]


def reference_logits(model, ids, dtype):
    torch = require("torch")
    model = model.double() if dtype == np.float64 else model.float()
    with torch.no_grad():
        return model(torch.from_numpy(np.atleast_2d(ids))).logits.numpy()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A random GPT-2 saved by transformers itself (safetensors, ``transformer.`` keys), and the model."""
    model = random_gpt2(TINY, seed=3)
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder), model


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_loads_what_transformers_saved(hf_folder, dtype, monkeypatch):
    folder, model = hf_folder
    monkeypatch.setattr(pretrained, "_download", lambda *a, **k: pytest.fail("a folder must not touch the network"))
    m = pretrained.load(folder, dtype)
    ids = np.array([[1, 5, 9, 2, 44, 7], [0, 0, 3, 49, 8, 8]])
    logits, cache = m.forward(ids)
    ref = reference_logits(model, ids, dtype)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(logits, ref, rtol=tol, atol=tol * np.abs(ref).max())
    assert cache["blocks.1.attn.weights"].shape == (2, TINY["n_head"], 6, 6)
    assert m.config.norm_placement == "pre" and m.config.tied_unembed and m.config.positional == "learned"
    assert all(not v.flags.writeable for v in m.params.values())          # shared by every session: read-only


def test_keys_without_the_transformer_prefix_load(hf_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder, model = hf_folder
    shutil.copy(os.path.join(folder, "config.json"), tmp_path / "config.json")
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    assert not any(k.startswith("transformer.") for k in tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = np.array([4, 8, 15, 16, 23, 42])
    logits, _ = pretrained.load(str(tmp_path), np.float64).forward(ids)
    np.testing.assert_allclose(logits, reference_logits(model, ids, np.float64), rtol=1e-9, atol=1e-9)


def test_transformers_loads_what_we_saved(hf_folder, tmp_path):
    transformers = require("transformers")
    folder, _ = hf_folder
    ours = pretrained.load(folder, np.float32)
    pretrained.save(ours.params, ours.config, str(tmp_path))
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    ref = reference_logits(theirs, ids, np.float32)
    logits, _ = ours.forward(ids)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    again = pretrained.load(str(tmp_path), np.float32)                      # and our own reader agrees
    for name, value in ours.params.items():
        np.testing.assert_array_equal(again.params[name], value)


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
    with pytest.raises(ValueError, match="t5 model: only the GPT-2 family .* and the BERT family"):
        pretrained.load(folder)


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


def test_missing_folder_and_offline_hub_name(monkeypatch):
    with pytest.raises(ValueError, match="no folder"):
        pretrained.load("./no/such/folder")

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ValueError, match="put the checkpoint in a folder"):
        pretrained.load("gpt2")


def test_empty_text_and_a_model_without_tokenizer(hf_folder):
    m = pretrained.load(hf_folder[0])
    with pytest.raises(ValueError, match="tokenizer.json"):
        m.encode("hello")


def test_save_refuses_another_architecture(tmp_path):
    from core.model import config as C

    gpt2 = dict(vocab_size=9, n_ctx=8, d_model=8, n_heads=2, d_ff=8, n_layers=1, norm_placement="pre", activation="gelu_tanh",
                positional="learned", tied_unembed=True, final_ln=True)
    others = [dict(gpt2, norm_placement="post"), dict(gpt2, d_ff=0), dict(gpt2, unembed_b=True),
              dict(gpt2, tied_unembed=False, head="classify", n_classes=2)]
    for settings in others:
        cfg = C.TransformerConfig(**settings)
        with pytest.raises(ValueError, match="GPT-2's architecture"):
            pretrained.save(C.init_params(cfg), cfg, str(tmp_path))
        assert not os.listdir(tmp_path)


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
