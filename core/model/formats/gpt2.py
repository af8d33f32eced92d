"""GPT-2-family checkpoints (gpt2, distilgpt2, ...) in the Hugging Face format: the only place that
knows GPT-2's tensor names, layouts and ``config.json``; read, and written back.

GPT-2's tensors map to the project's vocabulary (:mod:`core.model.transformer`)::

    wte                  -> embed (V, d)           and the unembedding, tied: logits = h @ embed^T
    wpe                  -> pos (n_ctx, d)
    h.{i}.ln_1 / ln_2    -> blocks.{i}.ln1 / ln2   (.weight -> .g, .bias -> .b)
    h.{i}.attn.c_attn    -> blocks.{i}.attn.W_Q | W_K | W_V   (d, 3d) split along the output axis
    h.{i}.attn.c_proj    -> blocks.{i}.attn.W_O
    h.{i}.mlp.c_fc       -> blocks.{i}.ffn.W_1     h.{i}.mlp.c_proj -> blocks.{i}.ffn.W_2
    ln_f                 -> ln_final

GPT-2's ``Conv1D`` stores its weight as ``(d_in, d_out)`` and computes ``x @ W + b``, as we do, so
no weight is transposed. Keys may carry a ``transformer.`` prefix (``GPT2LMHeadModel``) or not
(``GPT2Model``); both load, and :func:`to_checkpoint` writes ``GPT2LMHeadModel``'s.
"""
from __future__ import annotations

import numpy as np

from core.model import config as C
from core.model import presets
from core.model.formats.tensors import Tensors

MODEL_TYPE = "gpt2"
FAMILY = "the GPT-2 family (model_type 'gpt2': gpt2, distilgpt2, ...)"
PREFIX = "transformer."
# GPT-2's activation names: "gelu_new" is the tanh form, as is "gelu_pytorch_tanh"
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu"}
BUFFERS = (".attn.bias", ".attn.masked_bias")     # the causal-mask buffers older checkpoints saved
NOT_RUN = ("lm_head.",)                           # GPT2LMHeadModel's saved copy of its tied wte


# ----------------------------------------------------------------------------------------------
# the configuration: GPT-2's config.json <-> our TransformerConfig
# ----------------------------------------------------------------------------------------------
def config_from(hf: dict) -> C.TransformerConfig:
    """Our config for a GPT-2 ``config.json``; a ValueError for another family or a variant we don't run."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ValueError(f"This is a {hf.get('model_type') or 'unnamed'} model, not a GPT-2 one.")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(f"Activation {act!r} is not supported; GPT-2 uses 'gelu_new' (GELU, tanh form).")
    for flag, ok in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                     ("scale_attn_weights", True)):
        if hf.get(flag, ok) != ok:
            raise ValueError(f"This checkpoint sets {flag}={hf[flag]!r}; only GPT-2's standard attention "
                             f"({flag}={ok}) is supported.")
    d = hf.get("n_embd", 768)
    return presets.gpt2(vocab_size=hf.get("vocab_size", 50257), n_ctx=hf.get("n_positions", 1024), d_model=d,
                        n_heads=hf.get("n_head", 12), d_ff=hf.get("n_inner") or 4 * d, n_layers=hf.get("n_layer", 12),
                        activation=ACTIVATIONS[act], ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)))


def hf_config(cfg: C.TransformerConfig) -> dict:
    """GPT-2's ``config.json`` for one of our configs; a ValueError when the architecture isn't GPT-2's."""
    wanted = dict(norm_placement="pre", positional="learned", tied_unembed=True, final_ln=True, bias=True, causal=True,
                  head="lm", unembed_b=False)
    wrong = [f"{k}={getattr(cfg, k)!r} (GPT-2: {v!r})" for k, v in wanted.items() if getattr(cfg, k) != v]
    if cfg.d_ff == 0:
        wrong.append("d_ff=0, no feed-forward sublayer (GPT-2 has one in every block)")
    if wrong:
        raise ValueError("The GPT-2 format holds only GPT-2's architecture; this model has " + ", ".join(wrong) + ".")
    return {"model_type": MODEL_TYPE, "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_ctx, "n_embd": cfg.d_model, "n_head": cfg.n_heads, "n_layer": cfg.n_layers,
            "n_inner": cfg.d_ff, "layer_norm_epsilon": cfg.ln_eps,
            "activation_function": "gelu_new" if cfg.activation == "gelu_tanh" else "relu",
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True}


# ----------------------------------------------------------------------------------------------
# the weights: GPT-2's tensors <-> our parameters
# ----------------------------------------------------------------------------------------------
def in_model(name: str) -> bool:
    """Whether the checkpoint's tensor ``name`` is one the model runs (not a mask buffer, not a tied copy)."""
    return not name.endswith(BUFFERS) and not name.startswith(NOT_RUN)


def params_from(tensors: dict, cfg: C.TransformerConfig, dtype=np.float32) -> tuple[C.TransformerConfig, dict]:
    """Our config and parameters from GPT-2's tensors (names with or without ``transformer.``).

    ``c_attn``'s three column blocks are views, not copies, so a float32 checkpoint loaded as
    float32 costs its own size once.
    """
    t = Tensors(tensors, "GPT-2", dtype, PREFIX)
    V, d, F = cfg.vocab_size, cfg.d_model, cfg.d_ff

    def norm(name):
        return t.get(name + ".weight", (d,)), t.get(name + ".bias", (d,))

    p = {"embed": t.get("wte.weight", (V, d)), "pos": t.get("wpe.weight", (cfg.n_ctx, d))}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        W, bias = t.get(h + "attn.c_attn.weight", (d, 3 * d)), t.get(h + "attn.c_attn.bias", (3 * d,))
        for k, name in enumerate("QKV"):
            p[f"{b}attn.W_{name}"] = W[:, k * d:(k + 1) * d]                  # (d, d) view
            p[f"{b}attn.b_{name}"] = bias[k * d:(k + 1) * d]
        p[b + "attn.W_O"] = t.get(h + "attn.c_proj.weight", (d, d))
        p[b + "attn.b_O"] = t.get(h + "attn.c_proj.bias", (d,))
        p[b + "ln1.g"], p[b + "ln1.b"] = norm(h + "ln_1")
        p[b + "ffn.W_1"], p[b + "ffn.b_1"] = t.get(h + "mlp.c_fc.weight", (d, F)), t.get(h + "mlp.c_fc.bias", (F,))
        p[b + "ffn.W_2"], p[b + "ffn.b_2"] = t.get(h + "mlp.c_proj.weight", (F, d)), t.get(h + "mlp.c_proj.bias", (d,))
        p[b + "ln2.g"], p[b + "ln2.b"] = norm(h + "ln_2")
    p["ln_final.g"], p["ln_final.b"] = norm("ln_f")
    return cfg, p


def tensors_from(params: dict, cfg: C.TransformerConfig) -> dict[str, np.ndarray]:
    """GPT-2's tensors (``GPT2LMHeadModel`` names) for our parameters: the inverse of :func:`params_from`."""
    C.check_params(params, cfg)
    t = {"wte.weight": params["embed"], "wpe.weight": params["pos"]}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        t[h + "attn.c_attn.weight"] = np.concatenate([params[f"{b}attn.W_{n}"] for n in "QKV"], axis=1)
        t[h + "attn.c_attn.bias"] = np.concatenate([params[f"{b}attn.b_{n}"] for n in "QKV"])
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = params[b + "attn.W_O"], params[b + "attn.b_O"]
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = params[b + "ln1.g"], params[b + "ln1.b"]
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = params[b + "ffn.W_1"], params[b + "ffn.b_1"]
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = params[b + "ffn.W_2"], params[b + "ffn.b_2"]
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = params[b + "ln2.g"], params[b + "ln2.b"]
    t["ln_f.weight"], t["ln_f.bias"] = params["ln_final.g"], params["ln_final.b"]
    return {PREFIX + k: np.ascontiguousarray(v) for k, v in t.items()}


def to_checkpoint(params: dict, cfg: C.TransformerConfig) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config.json, tensors)`` for our parameters, as ``GPT2LMHeadModel`` saves them; a ValueError,
    before anything is built, when the architecture isn't GPT-2's."""
    hf = hf_config(cfg)
    return hf, tensors_from(params, cfg)
