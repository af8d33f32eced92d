"""DistilBERT's format (core.model.formats.distilbert): DistilBERT encoders run by our transformer,
against `transformers.DistilBertModel` (random weights, no download)."""
import copy
import json
import os
import shutil

import numpy as np
import pytest

from core import pretrained
from core.model import config as C
from core.model.formats import distilbert
from oracle_support import random_model, require

TINY = dict(vocab_size=60, dim=16, n_heads=4, n_layers=2, hidden_dim=40, max_position_embeddings=24)
ODD = dict(vocab_size=33, dim=18, n_heads=3, n_layers=3, hidden_dim=20, max_position_embeddings=16, activation="relu")
TABLE = "embeddings.position_embeddings.weight"


def random_distilbert(settings: dict, seed: int = 0, model_class: str = "DistilBertModel"):
    """A DistilBERT whose every parameter is random, LayerNorm gains and biases included; with
    ``sinusoidal_pos_embds`` its position table stays the fixed one transformers builds."""
    transformers = require("transformers")
    config = transformers.DistilBertConfig(**settings, dropout=0.0, attention_dropout=0.0)
    fixed = settings.get("sinusoidal_pos_embds", False)
    return random_model(getattr(transformers, model_class), config, seed,
                        is_gain=lambda name: name.endswith(("LayerNorm.weight", "layer_norm.weight")),
                        keep=lambda name: fixed and name.endswith(TABLE))


def copy_of(folder, tmp_path) -> str:
    for name in os.listdir(folder):
        shutil.copy(os.path.join(folder, name), tmp_path / name)
    return str(tmp_path)


def saved(model, folder) -> str:
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


def padded(vocab_size: int, lengths, seed: int = 0):
    """Ids ``(B, T)`` padded with 0 and their ``attention_mask``."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(1, vocab_size, n)
        mask[b, :n] = 1
    return ids, mask


def reference(model, ids, mask, dtype):
    torch = require("torch")
    model = model.double() if dtype == np.float64 else model.float()
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=None if mask is None else torch.from_numpy(mask),
                    output_attentions=True)
    return out.last_hidden_state.numpy(), [a.numpy() for a in out.attentions]


def assert_matches(m, model, ids, mask, dtype):
    """The last hidden state at every real token and every attention map, as transformers has them."""
    hidden, attentions = reference(model, ids, mask, dtype)
    ours, cache = m.forward(ids, key_mask=mask)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    real = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)   # padding's outputs: undefined
    np.testing.assert_allclose(ours[real], hidden[real], rtol=tol, atol=tol * np.abs(hidden).max())
    assert len(attentions) == m.config.n_layers
    for i, ref in enumerate(attentions):
        A = cache[f"blocks.{i}.attn.weights"]                                  # (B, H, T, T)
        np.testing.assert_allclose(A, ref, rtol=tol, atol=tol)
        if mask is not None:
            np.testing.assert_array_equal(A * (1 - mask[:, None, None, :]), 0.0)   # padding keys get exactly 0


@pytest.fixture(scope="module", params=[TINY, ODD], ids=["tiny", "odd_relu"])
def distilbert_folder(request, tmp_path_factory):
    model = random_distilbert(request.param, seed=7)
    return saved(model, tmp_path_factory.mktemp("distilbert")), model, request.param


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_matches_transformers_distilbert(distilbert_folder, dtype):
    folder, model, settings = distilbert_folder
    m = pretrained.load(folder, dtype)
    cfg = m.config
    assert m.family == "distilbert" and m.is_encoder and cfg.head == "none" and not cfg.causal
    assert cfg.norm_placement == "post" and cfg.embed_ln and not cfg.pooler and cfg.n_token_types == 0
    assert cfg.positional == "learned" and cfg.ln_eps == 1e-12
    assert cfg.activation == ("relu" if settings.get("activation") == "relu" else "gelu_erf")
    ids, mask = padded(settings["vocab_size"], [7, 4, 9], seed=1)
    assert_matches(m, model, ids, mask, dtype)                                 # with padding
    assert_matches(m, model, ids[:, :6], None, dtype)                          # and without
    assert all(not v.flags.writeable for v in m.params.values())


def test_checkpoint_count_equals_the_configs(distilbert_folder):
    folder, model, _ = distilbert_folder
    m = pretrained.load(folder)
    assert m.checkpoint_params == C.param_count(m.config) == sum(p.numel() for p in model.parameters())


def test_a_masked_lm_checkpoint_loads_its_encoder(tmp_path):
    """``DistilBertForMaskedLM`` saves ``distilbert.``-prefixed keys beside its head, which is not read."""
    model = random_distilbert(TINY, seed=2, model_class="DistilBertForMaskedLM")
    m = pretrained.load(saved(model, tmp_path), np.float64)
    ids, mask = padded(TINY["vocab_size"], [5, 8], seed=4)
    assert_matches(m, model.distilbert, ids, mask, np.float64)
    assert m.checkpoint_params == C.param_count(m.config) == sum(p.numel() for p in model.distilbert.parameters())


# ----------------------------------------------------------------------------------------------
# sinusoidal_pos_embds: a fixed table, run as our sinusoidal encoding once checked to be it
# ----------------------------------------------------------------------------------------------
SINUSOIDAL = dict(TINY, sinusoidal_pos_embds=True)


@pytest.fixture(scope="module")
def sinusoidal_folder(tmp_path_factory):
    model = random_distilbert(SINUSOIDAL, seed=9)
    return saved(model, tmp_path_factory.mktemp("sinusoidal")), model


def float64_table(model, monkeypatch):
    """The model made float64 with its position table too: transformers writes the table through a
    float32 tensor whatever the model's precision, so here it is written again by transformers' own
    function with float64 in place of float32."""
    torch = require("torch")
    from transformers.models.distilbert import modeling_distilbert

    model = copy.deepcopy(model).double()
    n, d = model.embeddings.position_embeddings.weight.shape
    with monkeypatch.context() as patch:
        patch.setattr(torch, "FloatTensor", torch.DoubleTensor)
        table = modeling_distilbert.create_sinusoidal_embeddings(n, d, torch.empty(n, d, dtype=torch.float64))
    with torch.no_grad():
        model.embeddings.position_embeddings.weight.copy_(table)
    return model


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_sinusoidal_positions_run_as_our_encoding(sinusoidal_folder, dtype, monkeypatch):
    folder, model = sinusoidal_folder
    m = pretrained.load(folder, dtype)
    assert m.config.positional == "sinusoidal" and "pos" not in m.params
    if dtype == np.float64:
        model = float64_table(model, monkeypatch)
    ids, mask = padded(TINY["vocab_size"], [9, 3, 24], seed=5)
    assert_matches(m, model, ids, mask, dtype)


def test_a_float64_checkpoint_holds_the_table_transformers_rounded_to_float32(sinusoidal_folder, tmp_path):
    """Saved from a float64 model, the file's table is float64 but its values are float32's: still ours."""
    torch = require("torch")
    _, model = sinusoidal_folder
    model = copy.deepcopy(model).double()
    m = pretrained.load(saved(model, tmp_path), np.float64)
    assert m.config.positional == "sinusoidal"
    ids = np.arange(1, 12)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids[None])).last_hidden_state.numpy()
    np.testing.assert_allclose(m.forward(ids)[0], ref, rtol=1e-6, atol=1e-6)   # the table's float32 rounding


def with_table(folder, tmp_path, table):
    from safetensors.numpy import load_file, save_file

    folder = copy_of(folder, tmp_path)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    tensors[TABLE] = table.astype(tensors[TABLE].dtype)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return folder


def halves(n, d):
    """Another sinusoidal layout (tensor2tensor's): all the sines, then all the cosines."""
    angle = np.arange(n)[:, None] / 10000.0 ** (2 * np.arange(d // 2) / d)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


@pytest.mark.parametrize("other", ["halves", "learned"])
def test_a_table_that_is_not_our_sinusoid_is_refused(sinusoidal_folder, tmp_path, other):
    folder, _ = sinusoidal_folder
    n, d = TINY["max_position_embeddings"], TINY["dim"]
    table = halves(n, d) if other == "halves" else 0.1 * np.random.default_rng(0).standard_normal((n, d))
    with pytest.raises(ValueError, match=r"sets sinusoidal_pos_embds, but the position table .* is not the "
                                         r"sinusoidal encoding.*at position \d+, feature \d+"):
        pretrained.load(with_table(folder, tmp_path, table))


# ----------------------------------------------------------------------------------------------
# a checkpoint we cannot run: a ValueError in the checkpoint's own terms
# ----------------------------------------------------------------------------------------------
def test_a_missing_tensor_is_named(distilbert_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = copy_of(distilbert_folder[0], tmp_path)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    del tensors["transformer.layer.1.attention.v_lin.bias"]
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"no tensor 'transformer\.layer\.1\.attention\.v_lin\.bias': this is not "
                                         r"a complete DistilBERT checkpoint"):
        pretrained.load(folder)


def test_a_tensor_of_the_wrong_shape_is_named(distilbert_folder, tmp_path):
    """config.json says a wider feed-forward layer than the weights hold."""
    folder = copy_of(distilbert_folder[0], tmp_path)
    settings = distilbert_folder[2]
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["hidden_dim"] += 2
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    d, F = settings["dim"], settings["hidden_dim"]
    with pytest.raises(ValueError, match=rf"'transformer\.layer\.0\.ffn\.lin1\.weight' has shape \({F}, {d}\), but "
                                         rf"config\.json's sizes make it \({F + 2}, {d}\)"):
        pretrained.load(folder)


def test_an_activation_we_do_not_run_is_refused():
    with pytest.raises(ValueError, match="Activation 'swish'"):
        distilbert.config_from({"model_type": "distilbert", **TINY, "activation": "swish"})
