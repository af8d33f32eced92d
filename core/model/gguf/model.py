"""A Llama-family GGUF file (SmolLM2, Llama, ...) read for :func:`core.model.pretrained.load`: its
config from the metadata, its weights as compact matrices read in place, its tokenizer.

llama.cpp's tensor names map to the project's vocabulary::

    token_embd                 -> embed (V, d)            the unembedding too when output is absent (tied)
    blk.{i}.attn_norm          -> blocks.{i}.ln1.g        RMSNorm gains
    blk.{i}.attn_q | k | v     -> blocks.{i}.attn.W_Q | W_K | W_V
    blk.{i}.attn_output        -> blocks.{i}.attn.W_O
    blk.{i}.ffn_norm           -> blocks.{i}.ln2.g
    blk.{i}.ffn_gate | up      -> blocks.{i}.ffn.W_gate | W_1
    blk.{i}.ffn_down           -> blocks.{i}.ffn.W_2
    output_norm                -> ln_final.g
    output                     -> unembed (d, V)          only in an untied file

Every 2-D weight is stored ``(out, in)`` and used transposed (:mod:`core.model.gguf.matrix`).
llama.cpp's converter reorders the rows of each query and key head, from transformers' rotary
layout (the first half of a head's features paired with the second) to its own (neighbours
paired); the reader puts them back, as transformers does when it reads a GGUF.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import config as C
from core.model.gguf.file import GGUFFile, open_gguf
from core.model.gguf.matrix import MATRICES
from core.model.gguf.tokenizer import tokenizer_from

ARCHITECTURE = "llama"
FAMILY = "llama"

# (our name in a block, llama.cpp's in blk.{i}); the attention's query and key rows are reordered
BLOCK_WEIGHTS = {"attn.W_Q": "attn_q", "attn.W_K": "attn_k", "attn.W_V": "attn_v", "attn.W_O": "attn_output",
                 "ffn.W_gate": "ffn_gate", "ffn.W_1": "ffn_up", "ffn.W_2": "ffn_down"}
BLOCK_NORMS = {"ln1.g": "attn_norm", "ln2.g": "ffn_norm"}


@dataclasses.dataclass(frozen=True, eq=False)
class Checkpoint:
    """What a GGUF file holds, ready to run: our config, our parameters, its tokenizer, and the
    number of values in its tensors (:attr:`core.model.pretrained.Model.checkpoint_params`)."""

    config: C.TransformerConfig
    params: dict
    tokenizer: object
    checkpoint_params: int


def read(path: str, dtype=np.float32) -> Checkpoint:
    """The Llama-family GGUF file at ``path``, read in place (:func:`core.model.pretrained.load`
    makes it a model of family ``"llama"``); a ValueError that says what is wrong otherwise."""
    gguf = open_gguf(path)
    cfg = config_from(gguf.metadata, gguf)
    params = params_from(gguf, cfg, dtype)
    tokenizer = tokenizer_from(gguf.metadata, cfg.vocab_size)
    return Checkpoint(cfg, params, tokenizer, sum(info.size for info in gguf.tensors.values()))


# ----------------------------------------------------------------------------------------------
# the configuration
# ----------------------------------------------------------------------------------------------
def config_from(metadata: dict, gguf: GGUFFile) -> C.TransformerConfig:
    """Our config from a Llama GGUF's metadata (``llama.*``), with the vocabulary's size from the
    token embedding and the unembedding tied when the file has no ``output.weight``."""
    arch = metadata.get("general.architecture")
    if arch != ARCHITECTURE:
        raise ValueError(f"{gguf.path} holds a {arch or 'unnamed'} model (general.architecture); only the "
                         f"Llama family (general.architecture 'llama': SmolLM2, Llama, ...) is read here.")

    def need(key, kind=int):
        value = metadata.get(f"{ARCHITECTURE}.{key}")
        if value is None:
            raise ValueError(f"{gguf.path} has no {ARCHITECTURE}.{key} in its metadata, which a Llama model needs: "
                             f"the file is incomplete.")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{gguf.path}: {ARCHITECTURE}.{key} is {value!r}, not a number.")
        return kind(value)

    d, n_heads = need("embedding_length"), need("attention.head_count")
    kv_heads = need("attention.head_count_kv") if f"{ARCHITECTURE}.attention.head_count_kv" in metadata else n_heads
    if metadata.get(f"{ARCHITECTURE}.expert_count", 0):
        raise ValueError(f"{gguf.path} is a mixture-of-experts model, which is not supported.")
    d_k = d // n_heads if n_heads > 0 else 0             # (a head count of 0 is refused by the config)
    rotated = metadata.get(f"{ARCHITECTURE}.rope.dimension_count", d_k)
    if rotated != d_k:
        raise ValueError(f"{gguf.path} rotates {rotated} of each head's {d_k} features; only rotary positions "
                         f"over the whole head are supported.")
    scaling = metadata.get(f"{ARCHITECTURE}.rope.scaling.type", "none")
    if scaling != "none" and metadata.get(f"{ARCHITECTURE}.rope.scaling.factor", 1.0) not in (0.0, 1.0):
        raise ValueError(f"{gguf.path} scales its rotary positions ({scaling}); only plain rotary positions are "
                         f"supported.")
    if "token_embd.weight" not in gguf.tensors:
        raise ValueError(f"{gguf.path} has no token_embd.weight: the file is incomplete.")
    return C.TransformerConfig(
        vocab_size=gguf.tensors["token_embd.weight"].shape[0], n_ctx=need("context_length"), d_model=d,
        n_heads=n_heads, n_kv_heads=kv_heads, d_ff=need("feed_forward_length"), n_layers=need("block_count"),
        norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary",
        rope_base=need("rope.freq_base", float) if f"{ARCHITECTURE}.rope.freq_base" in metadata else 10000.0,
        ln_eps=need("attention.layer_norm_rms_epsilon", float), bias=False, final_ln=True,
        tied_unembed="output.weight" not in gguf.tensors)


# ----------------------------------------------------------------------------------------------
# the weights
# ----------------------------------------------------------------------------------------------
def rotary_row_order(n_heads: int, d_k: int) -> np.ndarray:
    """The file's query (or key) rows in transformers' order. llama.cpp stores head ``h``'s output
    features as pairs of neighbours, rows ``h d_k + 2 i + a`` (``a`` 0 or 1); transformers' rotary
    pairs feature ``i`` with ``i + d_k/2``, so its row ``h d_k + a d_k/2 + i`` is the file's
    ``h d_k + 2 i + a``."""
    return np.arange(n_heads * d_k).reshape(n_heads, d_k // 2, 2).transpose(0, 2, 1).reshape(-1)   # (H, 2, d_k/2)


def params_from(gguf: GGUFFile, cfg: C.TransformerConfig, dtype=np.float32) -> dict:
    """Our parameters from the file's tensors: 2-D weights as compact matrices over the memory map,
    norm gains as float arrays (float32: views of the file)."""
    dtype = np.dtype(dtype)
    shapes = C.param_shapes(cfg)
    orders = {"attn.W_Q": rotary_row_order(cfg.n_heads, cfg.d_k),
              "attn.W_K": rotary_row_order(cfg.kv_heads, cfg.d_k)}

    def weight(ours, theirs, transposed, order=None):
        expected = shapes[ours][::-1] if transposed else shapes[ours]     # the file's (out, in)
        _check_shape(gguf, theirs, expected)
        fmt = gguf.tensors[theirs].format.name
        if fmt == "F32":
            values = gguf.floats(theirs)
            values = (values if order is None else values[order]).astype(dtype)
            return np.ascontiguousarray(values.T) if transposed else values
        return MATRICES[fmt](gguf.raw(theirs), transposed=transposed, row_order=order, dtype=dtype)

    def gain(ours, theirs):
        _check_shape(gguf, theirs, shapes[ours])
        if gguf.tensors[theirs].format.name != "F32":
            raise ValueError(f"{gguf.path}: the norm gain {theirs!r} is {gguf.tensors[theirs].format.name}, not F32.")
        return gguf.floats(theirs).astype(dtype, copy=False)

    p = {"embed": weight("embed", "token_embd.weight", transposed=False)}
    for i in range(cfg.n_layers):
        for ours, theirs in BLOCK_WEIGHTS.items():
            p[f"blocks.{i}.{ours}"] = weight(f"blocks.{i}.{ours}", f"blk.{i}.{theirs}.weight", True, orders.get(ours))
        for ours, theirs in BLOCK_NORMS.items():
            p[f"blocks.{i}.{ours}"] = gain(f"blocks.{i}.{ours}", f"blk.{i}.{theirs}.weight")
    p["ln_final.g"] = gain("ln_final.g", "output_norm.weight")
    if not cfg.tied_unembed:
        p["unembed"] = weight("unembed", "output.weight", transposed=True)
    return p


def _check_shape(gguf: GGUFFile, name: str, shape: tuple) -> None:
    if name not in gguf.tensors:
        raise ValueError(f"{gguf.path} has no tensor {name!r}: this is not a complete Llama checkpoint.")
    found = gguf.tensors[name].shape
    if found != tuple(shape):
        raise ValueError(f"{gguf.path}: tensor {name!r} has shape {found} but the metadata's sizes make it "
                         f"{tuple(shape)}: the metadata and the weights do not belong together.")
