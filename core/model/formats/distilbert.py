"""DistilBERT checkpoints (distilbert-base-uncased, ...) in the Hugging Face format, as settings of
our one transformer: the only place that knows DistilBERT's tensor names, layouts and ``config.json``.

DistilBERT is BERT with half the blocks, no segment embeddings and no pooler: post-norm blocks, the
exact GELU, learned positions and a LayerNorm on the embeddings; ``DistilBertModel`` returns the
last hidden states. Its tensors map to the project's vocabulary::

    embeddings.word_embeddings                 -> embed (V, d)
    embeddings.position_embeddings             -> pos (n_ctx, d)
    embeddings.LayerNorm                       -> embed_ln          (.weight -> .g, .bias -> .b)
    transformer.layer.{i}.attention.q_lin | k_lin | v_lin  -> blocks.{i}.attn.W_Q | W_K | W_V
    transformer.layer.{i}.attention.out_lin                -> blocks.{i}.attn.W_O
    transformer.layer.{i}.sa_layer_norm                    -> blocks.{i}.ln1
    transformer.layer.{i}.ffn.lin1 | lin2                  -> blocks.{i}.ffn.W_1 | W_2
    transformer.layer.{i}.output_layer_norm                -> blocks.{i}.ln2

Every linear weight is PyTorch's ``(d_out, d_in)``, transposed once on load. Keys may carry a
``distilbert.`` prefix (``DistilBertForMaskedLM`` and friends) or not (``DistilBertModel``).
``config.json`` names the sizes ``dim``, ``n_heads``, ``hidden_dim``, ``n_layers``; every LayerNorm's
epsilon is 1e-12, fixed in the model's code rather than written in its config.

With ``sinusoidal_pos_embds`` the position table is fixed, not learned: it is then run as our
sinusoidal encoding, once the table in the file is checked to be that encoding.
"""
from __future__ import annotations

import numpy as np

from core import positional
from core.model import config as C
from core.model.formats.tensors import Tensors

MODEL_TYPE = "distilbert"
FAMILY = "the DistilBERT family (model_type 'distilbert': distilbert-base-uncased, ...)"
PREFIX = "distilbert."
BODY = ("embeddings.", "transformer.")             # DistilBertModel's own tensors; the rest are task heads
ACTIVATIONS = {"gelu": "gelu_erf", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
LINEARS = {"attention.q_lin": "attn.W_Q", "attention.k_lin": "attn.W_K", "attention.v_lin": "attn.W_V",
           "attention.out_lin": "attn.W_O", "ffn.lin1": "ffn.W_1", "ffn.lin2": "ffn.W_2"}
NORMS = {"sa_layer_norm": "ln1", "output_layer_norm": "ln2"}
LN_EPS = 1e-12                                     # nn.LayerNorm(dim, eps=1e-12) throughout modeling_distilbert
POSITIONS = "embeddings.position_embeddings.weight"


def config_from(hf: dict) -> C.TransformerConfig:
    """Our config for a DistilBERT ``config.json``; a ValueError for a variant we don't run."""
    act = hf.get("activation", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"Activation {act!r} is not supported; DistilBERT uses 'gelu' (the exact GELU).")
    return C.TransformerConfig(
        vocab_size=hf.get("vocab_size", 30522), n_ctx=hf.get("max_position_embeddings", 512),
        d_model=hf.get("dim", 768), n_heads=hf.get("n_heads", 12), d_ff=hf.get("hidden_dim", 3072),
        n_layers=hf.get("n_layers", 6), norm_placement="post", activation=ACTIVATIONS[act],
        positional="sinusoidal" if hf.get("sinusoidal_pos_embds", False) else "learned", final_ln=False,
        bias=True, causal=False, ln_eps=LN_EPS, head="none", n_token_types=0, embed_ln=True, pooler=False)


def in_model(name: str) -> bool:
    """Whether the checkpoint's tensor ``name`` is one the model runs (not a masked-LM or task head)."""
    return name.removeprefix(PREFIX).startswith(BODY)


def params_from(tensors: dict, cfg: C.TransformerConfig, dtype=np.float32) -> tuple[C.TransformerConfig, dict]:
    """Our config and parameters from DistilBERT's tensors. Heads on top of the encoder are not read."""
    t = Tensors(tensors, "DistilBERT", dtype, PREFIX)
    d, shapes = cfg.d_model, C.block_shapes(cfg)       # ours: (d_in, d_out)

    p = {"embed": t.get("embeddings.word_embeddings.weight", (cfg.vocab_size, d))}
    if cfg.positional == "sinusoidal":
        check_sinusoidal(t.raw(POSITIONS, (cfg.n_ctx, d)))
    else:
        p["pos"] = t.get(POSITIONS, (cfg.n_ctx, d))
    p["embed_ln.g"], p["embed_ln.b"] = t.layer_norm("embeddings.LayerNorm", d)
    for i in range(cfg.n_layers):
        p.update(t.block(f"transformer.layer.{i}.", f"blocks.{i}.", LINEARS, NORMS, shapes))
    return cfg, p


def check_sinusoidal(table: np.ndarray) -> None:
    """A ValueError unless the file's fixed position table ``(n_ctx, d)`` is our sinusoidal encoding
    (:func:`core.positional.sinusoidal`) up to float32 rounding, the precision transformers writes it in
    whatever the model's own."""
    ours = positional.sinusoidal(*table.shape, backend="cpu")                     # (n_ctx, d), float64
    gap = np.abs(table.astype(np.float64) - ours)                                  # NaN compares as a gap
    tol = 4 * max(np.finfo(table.dtype).eps, np.finfo(np.float32).eps)
    if not gap.max() <= tol:
        p, i = np.unravel_index(np.nanargmax(np.where(np.isnan(gap), np.inf, gap)), gap.shape)
        raise ValueError(
            f"config.json sets sinusoidal_pos_embds, but the position table in the weights ({POSITIONS}) is not the "
            f"sinusoidal encoding PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)): at "
            f"position {p}, feature {i} it holds {table[p, i]:.9g} where the encoding is {ours[p, i]:.9g}, further "
            f"apart than float32 rounding. Run as that encoding, the model would not be this checkpoint, so it is "
            f"not loaded.")
