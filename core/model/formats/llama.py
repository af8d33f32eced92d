"""Llama-family checkpoints (SmolLM2, Llama, TinyLlama, ...) in the Hugging Face format, as settings
of our one transformer: the only place that knows ``LlamaForCausalLM``'s tensor names and
``config.json``. (A GGUF file of the same family is read by :mod:`core.model.gguf`.)

Llama is GPT-2's pre-norm decoder with four changes, each a setting: RMSNorm (a gain, no bias),
rotary positions inside attention (none added to the embeddings), grouped-query attention
(``num_key_value_heads`` key/value heads shared by the query heads), and a gated SiLU feed-forward
network (SwiGLU); no biases anywhere. Its tensors map to the project's vocabulary::

    model.embed_tokens                         -> embed (V, d)
    model.layers.{i}.input_layernorm           -> blocks.{i}.ln1.g
    model.layers.{i}.self_attn.q|k|v|o_proj    -> blocks.{i}.attn.W_Q | W_K | W_V | W_O
    model.layers.{i}.post_attention_layernorm  -> blocks.{i}.ln2.g
    model.layers.{i}.mlp.gate|up|down_proj     -> blocks.{i}.ffn.W_gate | W_1 | W_2
    model.norm                                 -> ln_final.g
    lm_head                                    -> unembed (d, V); absent, or a copy of embed, when tied

Every weight is a PyTorch ``nn.Linear`` ``(out, in)`` and is transposed once, on reading, to our
``(in, out)``. transformers' rotary pairs feature ``i`` of a head with feature ``i + d_k/2`` (its
``rotate_half``), the layout the rotary setting uses, so no row is reordered here.
"""
from __future__ import annotations

import numpy as np

from core.model import config as C
from core.model.formats.tensors import Tensors

MODEL_TYPE = "llama"
FAMILY = "the Llama family (model_type 'llama': SmolLM2, Llama, TinyLlama, ...)"
LINEARS = {"self_attn.q_proj": "attn.W_Q", "self_attn.k_proj": "attn.W_K", "self_attn.v_proj": "attn.W_V",
           "self_attn.o_proj": "attn.W_O", "mlp.gate_proj": "ffn.W_gate", "mlp.up_proj": "ffn.W_1",
           "mlp.down_proj": "ffn.W_2"}
NORMS = {"input_layernorm": "ln1.g", "post_attention_layernorm": "ln2.g"}
TIED_COPY = "lm_head.weight"                     # saved by some tied checkpoints, equal to embed_tokens


def config_from(hf: dict) -> C.TransformerConfig:
    """Our config for a Llama ``config.json``; a ValueError for a variant we don't run."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"Activation {act!r} is not supported; Llama uses 'silu' (in its gated feed-forward network).")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag, False):
            raise ValueError(f"This checkpoint sets {flag}=true; only Llama's linear layers without biases are supported.")
    d, n_heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or d // n_heads
    if head_dim * n_heads != d:
        raise ValueError(f"This checkpoint's heads are {head_dim} wide, not hidden_size / num_attention_heads = "
                         f"{d // n_heads}; only heads that split the model's width are supported.")
    rope = hf.get("rope_parameters") or {}                 # transformers 5; earlier: rope_theta, rope_scaling
    scaling = hf.get("rope_scaling") or {}
    kinds = {rope.get("rope_type"), scaling.get("rope_type"), scaling.get("type")} - {None, "default"}
    if kinds:
        raise ValueError(f"This checkpoint scales its rotary positions ({', '.join(sorted(kinds))}); only plain "
                         f"rotary positions (rope_type 'default') are supported.")
    return C.TransformerConfig(
        vocab_size=hf.get("vocab_size", 32000), n_ctx=hf.get("max_position_embeddings", 2048), d_model=d,
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads, d_ff=hf.get("intermediate_size", 11008),
        n_layers=hf.get("num_hidden_layers", 32), norm="rmsnorm", norm_placement="pre", activation="silu",
        gated_ffn=True, positional="rotary", rope_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        ln_eps=float(hf.get("rms_norm_eps", 1e-6)), bias=False, final_ln=True,
        tied_unembed=bool(hf.get("tie_word_embeddings", False)))


def in_model(name: str) -> bool:
    """Whether the checkpoint's tensor ``name`` is one the model runs: all but the rotary table older
    checkpoints saved. (transformers saves no ``lm_head`` for a tied model; one that did would be
    counted here, though :func:`params_from` only checks it against the embedding.)"""
    return not name.endswith("rotary_emb.inv_freq")


def params_from(tensors: dict, cfg: C.TransformerConfig, dtype=np.float32) -> tuple[C.TransformerConfig, dict]:
    """Our config and parameters from ``LlamaForCausalLM``'s tensors (or ``LlamaModel``'s, without
    ``model.``); a tied checkpoint's saved ``lm_head`` must equal its embedding."""
    t = Tensors(tensors, "Llama", dtype, "model.")
    V, d, shapes = cfg.vocab_size, cfg.d_model, C.block_shapes(cfg)

    p = {"embed": t.get("embed_tokens.weight", (V, d))}
    for i in range(cfg.n_layers):
        layer, block = f"layers.{i}.", f"blocks.{i}."
        for theirs, ours in LINEARS.items():
            d_in, d_out = shapes[ours]
            p[block + ours] = t.linear(layer + theirs + ".weight", d_in, d_out)     # (out, in) -> (in, out)
        for theirs, ours in NORMS.items():
            p[block + ours] = t.get(layer + theirs + ".weight", (d,))
    p["ln_final.g"] = t.get("norm.weight", (d,))
    if not cfg.tied_unembed:
        p["unembed"] = t.linear(TIED_COPY, d, V)
    elif TIED_COPY in t and not np.array_equal(t.raw(TIED_COPY, (V, d)), t.raw("embed_tokens.weight", (V, d))):
        raise ValueError("config.json ties the unembedding to the embedding (tie_word_embeddings), but the weights' "
                         "lm_head.weight differs from model.embed_tokens.weight: set tie_word_embeddings to false.")
    return cfg, p
