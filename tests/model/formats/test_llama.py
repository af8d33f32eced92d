"""The Llama format (core.model.formats.llama): a random ``LlamaForCausalLM`` saved by transformers
itself (no download) read by our loader, every parameter its tensor transposed."""
import json
import os

import numpy as np
import pytest

from core import pretrained
from core.model import config as C
from core.model.formats import llama
from oracle_support import random_model, require

# 4 query heads over 2 key/value heads, a gated feed-forward network 96 wide
TINY_LLAMA = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=50000.0)
# transformers' names -> ours (the interface's vocabulary, written out here, not read from the reader)
OURS = {"self_attn.q_proj": "attn.W_Q", "self_attn.k_proj": "attn.W_K", "self_attn.v_proj": "attn.W_V",
        "self_attn.o_proj": "attn.W_O", "mlp.gate_proj": "ffn.W_gate", "mlp.up_proj": "ffn.W_1",
        "mlp.down_proj": "ffn.W_2", "input_layernorm": "ln1.g", "post_attention_layernorm": "ln2.g"}


def saved_llama(folder, seed=0, **settings):
    """A random ``LlamaForCausalLM`` saved in ``folder`` by ``save_pretrained``; the model."""
    transformers = require("transformers")
    config = transformers.LlamaConfig(**{**TINY_LLAMA, **settings})
    model = random_model(transformers.LlamaForCausalLM, config, seed, is_gain=lambda n: n.endswith("norm.weight"))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def our_name(name: str) -> str:
    if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        return {"model.embed_tokens.weight": "embed", "model.norm.weight": "ln_final.g", "lm_head.weight": "unembed"}[name]
    _, _, i, *rest = name.split(".")
    return f"blocks.{i}.{OURS['.'.join(rest[:-1])]}"


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_every_parameter_is_its_tensor_transposed(tmp_path, tied, dtype):
    model = saved_llama(tmp_path, tie_word_embeddings=tied)
    ours = pretrained.load(str(tmp_path), dtype)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight")                      # the embedding itself, not a parameter of its own
    assert ours.family == "llama" and set(ours.params) == {our_name(k) for k in state}
    for name, value in state.items():
        expected = value if value.ndim == 1 or name == "model.embed_tokens.weight" else value.T
        got = ours.params[our_name(name)]
        assert got.dtype == dtype and np.array_equal(got, expected.astype(dtype)), name
    assert ours.checkpoint_params == sum(v.size for v in state.values()) == C.param_count(ours.config)


def test_the_config_comes_from_config_json(tmp_path):
    saved_llama(tmp_path)
    cfg = pretrained.load(str(tmp_path)).config
    assert (cfg.vocab_size, cfg.n_ctx, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.n_layers) == (
        50, 32, 32, 4, 2, 48, 2)
    assert (cfg.rope_base, cfg.ln_eps, cfg.norm, cfg.norm_placement, cfg.activation, cfg.gated_ffn,
            cfg.positional, cfg.bias, cfg.final_ln) == (50000.0, 1e-5, "rmsnorm", "pre", "silu", True, "rotary",
                                                        False, True)
    old_style = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "rope_theta": 500.0,
                 "rope_scaling": None}                   # transformers 4's keys
    assert llama.config_from(old_style).rope_base == 500.0 and llama.config_from(old_style).n_kv_heads == 4


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "Activation 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "scales its rotary positions"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "scales its rotary positions"),
    ({"head_dim": 16}, "heads are 16 wide"),
])
def test_a_variant_we_do_not_run_is_refused(tmp_path, change, message):
    saved_llama(tmp_path)
    with open(tmp_path / "config.json") as f:
        hf = json.load(f)
    with open(tmp_path / "config.json", "w") as f:
        json.dump({**hf, **change}, f)
    with pytest.raises(ValueError, match=message):
        pretrained.load(str(tmp_path))


def test_a_tied_checkpoint_whose_lm_head_differs_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    saved_llama(tmp_path, tie_word_embeddings=True)
    path = os.path.join(tmp_path, "model.safetensors")
    tensors = load_file(path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        pretrained.load(str(tmp_path))
