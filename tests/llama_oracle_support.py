"""transformers' Llama as an oracle: a random ``LlamaForCausalLM`` (no download), made float64 all
the way through, and its weights in our vocabulary.

transformers' Llama rounds to float32 in three places even in a float64 model: its RMSNorm
(``hidden_states.to(torch.float32)``), the eager attention's softmax (``dtype=torch.float32``) and
the rotary angles (``inv_freq`` and ``position_ids`` as float32, their cos and sin in float32).
Against those roundings no model agrees to better than about 1e-7; :func:`float64_llama` computes
the same formulas in float64, so that ours can be held to 1e-9.
"""
import contextlib
from unittest import mock

import numpy as np

from oracle_support import random_model, require

# SmolLM2-135M's sizes per layer (d 576, 9 query heads over 3 key/value heads, d_ff 1536, rotary
# base 1e5, RMSNorm eps 1e-5, tied embeddings), with 2 layers and a small vocabulary to stay quick
SMOLLM2_LAYER = dict(vocab_size=96, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=64, rms_norm_eps=1e-5,
                     rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu")


def random_llama(settings: dict, seed: int = 0):
    """A ``LlamaForCausalLM`` from transformers' config names, every parameter random (RMSNorm gains
    near 1), eager attention, eval mode, float32."""
    transformers = require("transformers")
    config = transformers.LlamaConfig(**settings, attention_dropout=0.0)
    return random_model(transformers.LlamaForCausalLM, config, seed,
                        is_gain=lambda name: name.endswith("norm.weight"))


def _rms_norm(self, hidden_states):
    """LlamaRMSNorm.forward without its round trip through float32."""
    torch = require("torch")
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rotary(self, x, position_ids):
    """LlamaRotaryEmbedding.forward with the angles in the inverse frequencies' dtype (float64), not float32."""
    freqs = position_ids[..., None].to(self.inv_freq.dtype) * self.inv_freq
    emb = require("torch").cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def _eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager attention with the softmax in the queries' dtype, not float32."""
    torch = require("torch")
    from transformers.models.llama.modeling_llama import repeat_kv

    keys, values = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def float64_llama(model):
    """``model`` (a transformers Llama) in float64 within the ``with`` block, computing in float64 at
    every step: its parameters and buffers converted, the rotary inverse frequencies recomputed in
    float64 from its config, and its RMSNorm, rotary angles and eager softmax patched to stay in
    float64. The patches are on transformers' Llama classes and module: every Llama in the block
    computes this way; they are undone on leaving it (the model stays float64)."""
    torch = require("torch")
    from transformers.models.llama import modeling_llama as ml

    model.double()
    for module in model.modules():
        if isinstance(module, ml.LlamaRotaryEmbedding):
            if module.rope_type != "default":
                raise ValueError(f"float64_llama recomputes the default rotary frequencies, not {module.rope_type!r}.")
            config = module.config
            base = config.rope_parameters["rope_theta"]
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            module.inv_freq, module.original_inv_freq = inv_freq, inv_freq.clone()
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(ml.LlamaRMSNorm, "forward", _rms_norm))
        patches.enter_context(mock.patch.object(ml.LlamaRotaryEmbedding, "forward", _rotary))
        patches.enter_context(mock.patch.object(ml, "eager_attention_forward", _eager_attention))
        yield model


def ours_from_llama(model, dtype=np.float64):
    """``(cfg, params)``: a transformers Llama's config as our settings and its weights in our
    vocabulary (torch's Linear weights are ``(out, in)``: ours are their transposes)."""
    from core.model.config import TransformerConfig

    c = model.config
    cfg = TransformerConfig(vocab_size=c.vocab_size, n_ctx=c.max_position_embeddings, d_model=c.hidden_size,
                            n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                            d_ff=c.intermediate_size, n_layers=c.num_hidden_layers, norm="rmsnorm",
                            norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary",
                            rope_base=float(c.rope_parameters["rope_theta"]), tied_unembed=c.tie_word_embeddings,
                            final_ln=True, bias=False, ln_eps=c.rms_norm_eps)
    sd = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    linear = {"attn.W_Q": "self_attn.q_proj", "attn.W_K": "self_attn.k_proj", "attn.W_V": "self_attn.v_proj",
              "attn.W_O": "self_attn.o_proj", "ffn.W_gate": "mlp.gate_proj", "ffn.W_1": "mlp.up_proj",
              "ffn.W_2": "mlp.down_proj"}
    params = {"embed": sd["model.embed_tokens.weight"]}
    for i in range(cfg.n_layers):
        theirs = f"model.layers.{i}."
        params[f"blocks.{i}.ln1.g"] = sd[theirs + "input_layernorm.weight"]
        params[f"blocks.{i}.ln2.g"] = sd[theirs + "post_attention_layernorm.weight"]
        params.update({f"blocks.{i}.{ours}": sd[f"{theirs}{name}.weight"].T for ours, name in linear.items()})
    params["ln_final.g"] = sd["model.norm.weight"]
    if not cfg.tied_unembed:
        params["unembed"] = sd["lm_head.weight"].T
    return cfg, {name: np.ascontiguousarray(value, dtype=dtype) for name, value in params.items()}
