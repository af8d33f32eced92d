"""BERT's format (core.model.formats.bert): BERT-family encoders run by our transformer, against
`transformers.BertModel` (random weights, no download)."""
import json
import os
import shutil

import numpy as np
import pytest

from core import pretrained
from core.model import layers as L
from core.model import config as C
from core.model.formats import bert
from oracle_support import random_model, require

TINY = dict(vocab_size=60, hidden_size=16, num_attention_heads=4, num_hidden_layers=2, intermediate_size=40,
            max_position_embeddings=24, type_vocab_size=2)
ODD = dict(vocab_size=33, hidden_size=18, num_attention_heads=3, num_hidden_layers=3, intermediate_size=20,
           max_position_embeddings=16, type_vocab_size=3, layer_norm_eps=1e-5)
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)


def random_bert(settings: dict, seed: int = 0):
    """A `BertModel` (with its pooler) whose every parameter is random, LayerNorm gains and biases included."""
    transformers = require("transformers")
    config = transformers.BertConfig(**settings, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return random_model(transformers.BertModel, config, seed, is_gain=lambda name: "LayerNorm.weight" in name)


def saved(model, folder) -> str:
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def batch_with_padding(vocab_size: int, lengths, seed: int = 0):
    """Ids ``(B, T)`` padded with 0, their ``attention_mask`` and random segment ids (A then B)."""
    rng = np.random.default_rng(seed)
    T = max(lengths)
    ids = np.zeros((len(lengths), T), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(1, vocab_size, n)
        mask[b, :n] = 1
        types[b, n // 2:n] = 1
    return ids, mask, types


def reference(model, ids, mask, types, dtype):
    torch = require("torch")
    model = model.double() if dtype == np.float64 else model.float()
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.from_numpy(types), output_attentions=True)
    return out.last_hidden_state.numpy(), [a.numpy() for a in out.attentions], out.pooler_output.numpy()


def assert_matches(m, model, ids, mask, types, dtype):
    hidden, attentions, pooled = reference(model, ids, mask, types, dtype)
    ours, cache = m.forward(ids, key_mask=mask, token_types=types)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    real = mask.astype(bool)                      # padded positions' outputs are not defined the same way
    np.testing.assert_allclose(ours[real], hidden[real], rtol=tol, atol=tol * np.abs(hidden).max())
    for i, ref in enumerate(attentions):
        A = cache[f"blocks.{i}.attn.weights"]
        np.testing.assert_allclose(A, ref, rtol=tol, atol=tol)
        np.testing.assert_array_equal(A * (1 - mask[:, None, None, :]), 0.0)   # padding keys get exactly 0
    np.testing.assert_allclose(cache["pooler.output"], pooled, rtol=tol, atol=tol)


@pytest.fixture(scope="module", params=[TINY, ODD], ids=["tiny", "odd"])
def bert_folder(request, tmp_path_factory):
    model = random_bert(request.param, seed=5)
    return saved(model, tmp_path_factory.mktemp("bert")), model, request.param


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_matches_transformers_bert(bert_folder, dtype):
    folder, model, settings = bert_folder
    m = pretrained.load(folder, dtype)
    assert m.is_encoder and m.config.head == "none" and m.config.activation == "gelu_erf"
    assert not m.config.causal and m.config.norm_placement == "post" and m.config.embed_ln and m.config.pooler
    ids, mask, types = batch_with_padding(settings["vocab_size"], [7, 4, 9], seed=1)
    assert_matches(m, model, ids, mask, types, dtype)
    assert all(not v.flags.writeable for v in m.params.values())          # shared by every session: read-only


@pytest.fixture(scope="module")
def bert_base_folder(tmp_path_factory):
    model = random_bert(BERT_BASE, seed=2)
    return saved(model, tmp_path_factory.mktemp("bert_base")), model


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_matches_full_bert_base(bert_base_folder, dtype):
    folder, model = bert_base_folder
    m = pretrained.load(folder, dtype)
    assert m.config.n_layers == 12 and m.config.d_model == 768
    ids, mask, types = batch_with_padding(BERT_BASE["vocab_size"], [21, 13], seed=3)
    assert_matches(m, model, ids, mask, types, dtype)


def test_checkpoint_count_equals_the_configs(bert_folder):
    folder, model, _ = bert_folder
    m = pretrained.load(folder)
    assert m.checkpoint_params == C.param_count(m.config) == sum(p.numel() for p in model.parameters())


def test_keys_with_a_bert_prefix_and_old_layernorm_names_load(bert_folder, tmp_path):
    """``BertForMaskedLM`` and friends save ``bert.``-prefixed keys; early checkpoints ``gamma``/``beta``."""
    from safetensors.numpy import load_file, save_file

    folder, model, settings = bert_folder
    shutil.copy(os.path.join(folder, "config.json"), tmp_path / "config.json")
    renamed = {}
    for k, v in load_file(os.path.join(folder, "model.safetensors")).items():
        if "LayerNorm" in k:
            k = k.replace(".weight", ".gamma").replace(".bias", ".beta")
        renamed["bert." + k] = v
    renamed["cls.predictions.bias"] = np.zeros(settings["vocab_size"], np.float32)  # a head we don't read
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids, mask, types = batch_with_padding(settings["vocab_size"], [5, 6], seed=4)
    assert_matches(pretrained.load(str(tmp_path), np.float64), model, ids, mask, types, np.float64)


def test_exact_gelu_is_not_the_tanh_form():
    x = np.linspace(-6, 6, 2001)
    from math import erf, sqrt
    exact = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in x])
    np.testing.assert_allclose(L.gelu_erf(x), exact, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(L.gelu_erf(x.astype(np.float32)), exact, rtol=1e-6, atol=1e-6)
    assert np.abs(L.gelu_tanh(x) - exact).max() > 1e-4                 # which is why BERT needs its own


# ----------------------------------------------------------------------------------------------
# bad input: a clear ValueError
# ----------------------------------------------------------------------------------------------
def test_a_key_mask_must_leave_each_sequence_a_token(bert_folder):
    m = pretrained.load(bert_folder[0])
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match="at least one token that is not padding"):
        m.forward(ids, key_mask=[[1, 1, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="tokens' shape"):
        m.forward(ids, key_mask=[[1, 1], [1, 1]])
    with pytest.raises(ValueError, match="whole numbers from 0 to"):
        m.forward(ids, token_types=[[0, 1, m.config.n_token_types]] * 2)


def test_variants_we_do_not_run_are_refused():
    base = {"model_type": "bert", **TINY}
    with pytest.raises(ValueError, match="Activation 'swish'"):
        bert.config_from({**base, "hidden_act": "swish"})
    with pytest.raises(ValueError, match="relative_key"):
        bert.config_from({**base, "position_embedding_type": "relative_key"})


def test_a_tokenizer_of_another_model_is_refused(bert_folder, tmp_path):
    """A BERT tokenizer (30,522 word pieces) beside a model whose embedding has 60 rows."""
    folder, _, settings = bert_folder
    for name in os.listdir(folder):
        shutil.copy(os.path.join(folder, name), tmp_path / name)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"w{i}": i for i in range(settings["vocab_size"] + 1)}, unk_token="w0")).save(
        str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="the tokenizer belongs to another model"):
        pretrained.load(str(tmp_path))


def test_a_truncated_bert_checkpoint(bert_folder, tmp_path):
    folder = bert_folder[0]
    for name in os.listdir(folder):
        shutil.copy(os.path.join(folder, name), tmp_path / name)
    path = tmp_path / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(ValueError, match="truncated or damaged"):
        pretrained.load(str(tmp_path))


def test_config_json_of_bert_names_our_settings(bert_folder):
    with open(os.path.join(bert_folder[0], "config.json")) as f:
        cfg = bert.config_from(json.load(f))
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads) == (bert_folder[2]["num_hidden_layers"],
                                                        bert_folder[2]["hidden_size"],
                                                        bert_folder[2]["num_attention_heads"])
