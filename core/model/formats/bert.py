"""BERT-family checkpoints (BERT, MiniLM, ...) in the Hugging Face format, as settings of our one
transformer: the only place that knows BERT's tensor names, layouts and ``config.json``.

BERT is the original Transformer's encoder: post-norm blocks, the exact GELU, learned positions,
plus segment ("token type") embeddings and a LayerNorm on the embeddings; no causal mask and no
language-model head (``BertModel`` returns the last hidden states, and a pooler's
``tanh([CLS] W + b)``). Its tensors map to the project's vocabulary::

    embeddings.word_embeddings          -> embed (V, d)
    embeddings.position_embeddings      -> pos (n_ctx, d)
    embeddings.token_type_embeddings    -> token_type (n_types, d)
    embeddings.LayerNorm                -> embed_ln          (.weight -> .g, .bias -> .b)
    encoder.layer.{i}.attention.self.query | key | value  -> blocks.{i}.attn.W_Q | W_K | W_V
    encoder.layer.{i}.attention.output.dense              -> blocks.{i}.attn.W_O
    encoder.layer.{i}.attention.output.LayerNorm          -> blocks.{i}.ln1
    encoder.layer.{i}.intermediate.dense                  -> blocks.{i}.ffn.W_1
    encoder.layer.{i}.output.dense                        -> blocks.{i}.ffn.W_2
    encoder.layer.{i}.output.LayerNorm                    -> blocks.{i}.ln2
    pooler.dense                                          -> pooler.W, pooler.b

PyTorch's ``nn.Linear`` stores its weight ``(d_out, d_in)`` and computes ``x W^T + b``; we apply
``x @ W`` with ``W (d_in, d_out)``, so every linear weight is transposed once, on load. Keys may
carry a ``bert.`` prefix (``BertForMaskedLM`` and friends) or not (``BertModel``); older
checkpoints name LayerNorm's parameters ``gamma`` and ``beta``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import config as C
from core.model.formats.tensors import Tensors

MODEL_TYPE = "bert"
FAMILY = "the BERT family (model_type 'bert': bert-base-uncased, all-MiniLM-L6-v2, ...)"
PREFIX = "bert."
# BERT's "gelu" is the exact, erf form; "gelu_new" and friends are the tanh approximation.
ACTIVATIONS = {"gelu": "gelu_erf", "gelu_python": "gelu_erf", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
LINEARS = {"attention.self.query": "attn.W_Q", "attention.self.key": "attn.W_K", "attention.self.value": "attn.W_V",
           "attention.output.dense": "attn.W_O", "intermediate.dense": "ffn.W_1", "output.dense": "ffn.W_2"}
NORMS = {"attention.output.LayerNorm": "ln1", "output.LayerNorm": "ln2"}
NOT_RUN = ("cls.",)                                # the pre-training heads (masked LM, next sentence)


def config_from(hf: dict) -> C.TransformerConfig:
    """Our config for a BERT ``config.json``; a ValueError for a variant we don't run."""
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"Activation {act!r} is not supported; BERT uses 'gelu' (the exact GELU).")
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"This checkpoint uses {kind!r} position embeddings; only BERT's learned absolute "
                         f"positions are supported.")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ValueError("This BERT checkpoint is set up as a decoder; only BERT's encoder is supported.")
    return C.TransformerConfig(
        vocab_size=hf.get("vocab_size", 30522), n_ctx=hf.get("max_position_embeddings", 512),
        d_model=hf.get("hidden_size", 768), n_heads=hf.get("num_attention_heads", 12),
        d_ff=hf.get("intermediate_size", 3072), n_layers=hf.get("num_hidden_layers", 12), norm_placement="post",
        activation=ACTIVATIONS[act], positional="learned", final_ln=False, bias=True, causal=False,
        ln_eps=float(hf.get("layer_norm_eps", 1e-12)), head="none", n_token_types=hf.get("type_vocab_size", 2),
        embed_ln=True, pooler=False)


def in_model(name: str) -> bool:
    """Whether the checkpoint's tensor ``name`` is one the model runs (not a pre-training head)."""
    return not name.startswith(NOT_RUN)


def params_from(tensors: dict, cfg: C.TransformerConfig, dtype=np.float32) -> tuple[C.TransformerConfig, dict]:
    """Our config (with ``pooler`` set when the checkpoint has one) and parameters from BERT's tensors.
    Heads on top of the encoder (masked-LM, classifiers) are not read."""
    t = Tensors(tensors, "BERT", dtype, PREFIX)
    d, shapes = cfg.d_model, C.block_shapes(cfg)       # ours: (d_in, d_out)

    e = "embeddings."
    p = {"embed": t.get(e + "word_embeddings.weight", (cfg.vocab_size, d)),
         "pos": t.get(e + "position_embeddings.weight", (cfg.n_ctx, d)),
         "token_type": t.get(e + "token_type_embeddings.weight", (cfg.n_token_types, d))}
    p["embed_ln.g"], p["embed_ln.b"] = t.layer_norm(e + "LayerNorm", d)
    for i in range(cfg.n_layers):
        p.update(t.block(f"encoder.layer.{i}.", f"blocks.{i}.", LINEARS, NORMS, shapes))
    if "pooler.dense.weight" in t:
        cfg = dataclasses.replace(cfg, pooler=True)
        p["pooler.W"], p["pooler.b"] = t.linear("pooler.dense.weight", d, d), t.get("pooler.dense.bias", (d,))
    return cfg, p
