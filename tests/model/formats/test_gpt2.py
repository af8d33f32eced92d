"""GPT-2's format (core.model.formats.gpt2): read and written, against `transformers` (random weights,
no download)."""
import json
import os
import shutil

import numpy as np
import pytest

from core import pretrained
from core.model import config as C
from core.model.formats import gpt2
from oracle_support import TINY_GPT2 as TINY, require



def reference_logits(model, ids, dtype):
    torch = require("torch")
    model = model.double() if dtype == np.float64 else model.float()
    with torch.no_grad():
        return model(torch.from_numpy(np.atleast_2d(ids))).logits.numpy()


def copy_with(folder, tmp_path, tensors=None, config=None):
    """A copy of the checkpoint folder with its tensors and/or config.json replaced."""
    from safetensors.numpy import save_file

    for name in os.listdir(folder):
        shutil.copy(os.path.join(folder, name), tmp_path / name)
    if tensors is not None:
        save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        with open(tmp_path / "config.json", "w") as f:
            json.dump(config, f)
    return str(tmp_path)


def tensors_of(folder):
    from safetensors.numpy import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_loads_what_transformers_saved(hf_folder, dtype, monkeypatch):
    folder, model = hf_folder
    monkeypatch.setattr(pretrained.hub, "download_checkpoint", lambda *a, **k: pytest.fail("a folder must not touch the network"))
    m = pretrained.load(folder, dtype)
    ids = np.array([[1, 5, 9, 2, 44, 7], [0, 0, 3, 49, 8, 8]])
    logits, cache = m.forward(ids)
    ref = reference_logits(model, ids, dtype)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(logits, ref, rtol=tol, atol=tol * np.abs(ref).max())
    assert cache["blocks.1.attn.weights"].shape == (2, TINY["n_head"], 6, 6)
    assert m.config.norm_placement == "pre" and m.config.tied_unembed and m.config.positional == "learned"
    assert m.family == "gpt2" and not m.is_encoder
    assert all(not v.flags.writeable for v in m.params.values())          # shared by every session: read-only


def test_keys_without_the_transformer_prefix_load(hf_folder, tmp_path):
    folder, model = hf_folder
    tensors = {k.removeprefix("transformer."): v for k, v in tensors_of(folder).items()}
    assert not any(k.startswith("transformer.") for k in tensors)
    ids = np.array([4, 8, 15, 16, 23, 42])
    logits, _ = pretrained.load(copy_with(folder, tmp_path, tensors), np.float64).forward(ids)
    np.testing.assert_allclose(logits, reference_logits(model, ids, np.float64), rtol=1e-9, atol=1e-9)


def test_older_checkpoints_mask_buffers_and_tied_copy_are_not_counted(hf_folder, tmp_path):
    """The Hub's gpt2 file still holds each block's causal-mask buffers, and some files a copy of the
    tied ``wte`` as ``lm_head``: numbers in the file, but none of them a parameter the model runs."""
    folder, model = hf_folder
    tensors = tensors_of(folder)
    n = TINY["n_positions"]
    for i in range(TINY["n_layer"]):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, n, n), np.float32))
        tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].copy()
    m = pretrained.load(copy_with(folder, tmp_path, tensors))
    assert m.checkpoint_params == C.param_count(m.config) == sum(p.numel() for p in model.parameters())


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


def test_save_refuses_another_architecture(tmp_path):
    base = dict(vocab_size=9, n_ctx=8, d_model=8, n_heads=2, d_ff=8, n_layers=1, norm_placement="pre",
                activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)
    others = [dict(base, norm_placement="post"), dict(base, d_ff=0), dict(base, unembed_b=True),
              dict(base, tied_unembed=False, head="classify", n_classes=2)]
    for settings in others:
        cfg = C.TransformerConfig(**settings)
        with pytest.raises(ValueError, match="GPT-2's architecture"):
            pretrained.save(C.init_params(cfg), cfg, str(tmp_path))
        assert not os.listdir(tmp_path)


# ----------------------------------------------------------------------------------------------
# a checkpoint we cannot run: a ValueError in the checkpoint's own terms
# ----------------------------------------------------------------------------------------------
def test_a_missing_tensor_is_named(hf_folder, tmp_path):
    folder, _ = hf_folder
    tensors = {k: v for k, v in tensors_of(folder).items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match=r"no tensor 'h\.1\.mlp\.c_fc\.bias': this is not a complete GPT-2"):
        pretrained.load(copy_with(folder, tmp_path, tensors))


def test_a_tensor_of_the_wrong_shape_is_named(hf_folder, tmp_path):
    """A checkpoint whose config.json says 4 positions more than its wpe holds."""
    folder, _ = hf_folder
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["n_positions"] += 4
    with pytest.raises(ValueError, match=r"'wpe\.weight' has shape \(32, 16\), but config\.json's sizes make it "
                                         r"\(36, 16\)"):
        pretrained.load(copy_with(folder, tmp_path, config=config))


def test_variants_we_do_not_run_are_refused(hf_folder):
    transformers = require("transformers")
    base = transformers.GPT2Config(**TINY).to_dict()
    with pytest.raises(ValueError, match="Activation 'gelu_10'"):
        gpt2.config_from({**base, "activation_function": "gelu_10"})
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=True"):
        gpt2.config_from({**base, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(ValueError, match="a bert model, not a GPT-2 one"):
        gpt2.config_from({**base, "model_type": "bert"})
