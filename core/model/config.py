"""The one transformer's settings and parameters: :class:`TransformerConfig` (its architecture as
settings, checked on creation), the names and shapes of its parameters in their fixed order, fresh
parameters for a seed, and the checks of parameters and tokens. The forward pass is
:mod:`core.model.transformer`."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from core.model import params as P
from core.model.activations import ACTIVATIONS
from core.model.compact import CompactMatrix, wide
from core.model.norms import NORMS, PLACEMENTS
from core.model.params import init_by_name, whole as _whole
from core.model.positions import EMBEDDING_POSITIONAL, POSITIONAL, POSITIONS  # noqa: F401  (the names, read from here too)
from core.validate import check_heads

# each architectural choice is a name in its registry (a forward and a backward pass under that name)
CHOICES = {"norm": NORMS, "norm_placement": PLACEMENTS, "activation": ACTIVATIONS, "positional": POSITIONS}
HEADS = ("lm", "classify", "none")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and architecture of a decoder-only (or, with ``causal=False``, encoder) stack.

    ``norm_placement="post"`` puts each norm after its residual sum (the original Transformer),
    ``"pre"`` before its sublayer (GPT-2); ``norm`` is which norm, ``"layernorm"`` (a gain and a
    bias) or ``"rmsnorm"`` (a gain only). ``d_ff`` is the feed-forward width (GPT-2: ``4 d``,
    or its ``n_inner``), 0 for attention-only. ``bias=False`` drops every linear layer's bias.
    ``head="classify"`` averages the last hidden states over positions and maps them to
    ``n_classes`` logits (the seeds' encoder); ``unembed_b`` adds an output bias to the language
    model's logits (the tiny decoders have one). ``head="none"`` is an encoder without a head (BERT):
    the forward pass returns the last hidden states. ``activation="gelu_erf"`` is the exact GELU
    (BERT's), ``"gelu_tanh"`` its tanh approximation (GPT-2's). ``n_token_types`` adds BERT's
    segment embeddings, ``embed_ln`` its LayerNorm on the embeddings, ``pooler`` its dense layer
    on the first token, ``tanh([CLS] W + b)``.

    The Llama family's settings: ``n_kv_heads`` key/value heads shared by the ``n_heads`` query
    heads (grouped-query attention; query head ``h`` reads key/value head ``h // (n_heads //
    n_kv_heads)``; None: one per query head), ``gated_ffn`` a gated feed-forward network,
    ``(act(x W_gate) * (x W_1)) W_2`` (SwiGLU with ``activation="silu"``), and
    ``positional="rotary"``, which rotates each query and key by its position inside attention
    (frequencies ``rope_base ** (-2i / d_k)``) and adds nothing to the embeddings.

    ``norm``, ``norm_placement``, ``activation`` and ``positional`` each name a forward and a
    backward pass in a registry (:mod:`core.model.norms`, :mod:`core.model.activations`,
    :mod:`core.model.positions`); a name none of them has is refused here.
    """

    vocab_size: int
    n_ctx: int
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int
    norm_placement: str = "post"
    norm: str = "layernorm"
    activation: str = "relu"
    positional: str = "sinusoidal"
    tied_unembed: bool = False
    final_ln: bool = False
    bias: bool = True
    causal: bool = True
    ln_eps: float = 1e-5
    head: str = "lm"
    n_classes: int | None = None
    unembed_b: bool = False
    n_token_types: int = 0
    embed_ln: bool = False
    pooler: bool = False
    n_kv_heads: int | None = None
    gated_ffn: bool = False
    rope_base: float = 10000.0

    def __post_init__(self):
        for name in ("vocab_size", "n_ctx", "d_model", "n_heads", "d_ff", "n_layers", "n_token_types"):
            value = getattr(self, name)
            if not _whole(value) or value < (0 if name in ("d_ff", "n_token_types") else 1):  # 0: none
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        check_heads(self.d_model, self.n_heads)
        for name, choices in (*CHOICES.items(), ("head", HEADS)):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}.")
        if self.head == "classify" and (not _whole(self.n_classes) or self.n_classes < 2):
            raise ValueError(f"A classifier needs n_classes, at least 2, got {self.n_classes!r}.")
        if self.head != "lm" and (self.tied_unembed or self.unembed_b):
            raise ValueError(f"Only a language model has an unembedding (head={self.head!r}): leave "
                             f"tied_unembed and unembed_b False.")
        if self.head != "classify" and self.n_classes is not None:
            raise ValueError("n_classes belongs to a classifier (head='classify'); this model has none.")
        for name in ("tied_unembed", "final_ln", "bias", "causal", "unembed_b", "embed_ln", "pooler", "gated_ffn"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        eps = self.ln_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"ln_eps must be a small positive number, got {eps!r}.")
        self._check_llama_settings()

    def _check_llama_settings(self):
        """The grouped key/value heads, the gated feed-forward network and the rotary positions."""
        kv = self.n_kv_heads
        if kv is not None and (not _whole(kv) or kv < 1 or self.n_heads % kv):
            raise ValueError(f"n_kv_heads must be a whole number that divides n_heads = {self.n_heads} (each "
                             f"key/value head serves the same number of query heads), got {kv!r}; leave it None "
                             f"for one key/value head per query head.")
        if self.gated_ffn and self.d_ff == 0:
            raise ValueError("gated_ffn gates the feed-forward network, and d_ff = 0 has none: give d_ff > 0 "
                             "or leave gated_ffn False.")
        base = self.rope_base
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
            raise ValueError(f"rope_base must be a finite number above 1 (Llama's 10000, SmolLM2's 100000), "
                             f"got {base!r}.")
        if self.positional == "rotary" and self.d_k % 2:
            raise ValueError(f"Rotary positions turn each head's features in pairs: the head width d_k = "
                             f"d_model / n_heads = {self.d_k} must be even; pick another n_heads.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: ``n_kv_heads``, or ``n_heads`` when that is None."""
        return self.n_heads if self.n_kv_heads is None else int(self.n_kv_heads)

    @property
    def group(self) -> int:
        """Query heads per key/value head: query head ``h`` reads key/value head ``h // group``."""
        return self.n_heads // self.kv_heads


# ----------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------
def norm_shapes(cfg: TransformerConfig, part: str) -> dict[str, tuple[int, ...]]:
    """The parameters of the norm ``part`` (``ln1``, ``ln_final`` ...): those its kind has (LayerNorm
    ``{part}.g`` and ``{part}.b``, RMSNorm ``{part}.g`` only), each ``(d,)``."""
    return {f"{part}.{w}": (cfg.d_model,) for w in NORMS[cfg.norm].params}


def block_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """One block's parameters under their short names (``attn.W_Q`` ...), in the order they run.
    ``W_K`` and ``W_V`` are ``(d, n_kv_heads d_k)``: with grouped-query attention narrower than ``W_Q``."""
    d, F, kv = cfg.d_model, cfg.d_ff, cfg.kv_heads * cfg.d_k      # kv: the key/value heads side by side
    shapes = {"attn.W_Q": (d, d), "attn.W_K": (d, kv), "attn.W_V": (d, kv), "attn.W_O": (d, d)}
    if cfg.bias:
        shapes.update({"attn.b_Q": (d,), "attn.b_K": (kv,), "attn.b_V": (kv,), "attn.b_O": (d,)})
    shapes.update(norm_shapes(cfg, "ln1"))
    if F == 0:                                          # attention-only: no feed-forward, no ln2
        return shapes
    if cfg.gated_ffn:
        shapes["ffn.W_gate"] = (d, F)
    shapes.update({"ffn.W_1": (d, F), "ffn.W_2": (F, d)})
    if cfg.bias and cfg.gated_ffn:
        shapes["ffn.b_gate"] = (F,)
    if cfg.bias:
        shapes.update({"ffn.b_1": (F,), "ffn.b_2": (d,)})
    shapes.update(norm_shapes(cfg, "ln2"))
    return shapes


def param_shapes(cfg: TransformerConfig, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order: embeddings, blocks, output."""
    d = cfg.d_model
    shapes = {f"{prefix}embed": (cfg.vocab_size, d)}
    shapes.update({f"{prefix}{name}": (cfg.n_ctx, d) for name in POSITIONS[cfg.positional].params})   # learned: pos
    if cfg.n_token_types:
        shapes[f"{prefix}token_type"] = (cfg.n_token_types, d)
    if cfg.embed_ln:
        shapes.update(norm_shapes(cfg, f"{prefix}embed_ln"))
    for i in range(cfg.n_layers):
        shapes.update({f"{prefix}blocks.{i}.{name}": s for name, s in block_shapes(cfg).items()})
    if cfg.final_ln:
        shapes.update(norm_shapes(cfg, f"{prefix}ln_final"))
    if cfg.pooler:
        shapes.update({f"{prefix}pooler.W": (d, d), f"{prefix}pooler.b": (d,)})
    if cfg.head == "none":
        return shapes
    if cfg.head == "classify":
        shapes.update({f"{prefix}classifier.W": (d, cfg.n_classes), f"{prefix}classifier.b": (cfg.n_classes,)})
        return shapes
    if not cfg.tied_unembed:
        shapes[f"{prefix}unembed"] = (d, cfg.vocab_size)
    if cfg.unembed_b:
        shapes[f"{prefix}unembed_b"] = (cfg.vocab_size,)
    return shapes


def param_count(cfg: TransformerConfig) -> int:
    """Number of trainable numbers (a tied unembedding is counted once)."""
    return int(sum(math.prod(s) for s in param_shapes(cfg).values()))


def init_params(cfg: TransformerConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters, deterministic for a seed: weights ``N(0, 1/d_in)``, embeddings ``N(0, 1)``
    (scaled by ``1/sqrt(d)`` when tied, so the logits start small), learned positions
    ``N(0, 0.1^2)``, LayerNorm gains 1, biases 0."""
    params = init_by_name(param_shapes(cfg), seed, dtype)
    if cfg.tied_unembed:
        params["embed"] = np.ascontiguousarray(params["embed"] / math.sqrt(cfg.d_model))
    return params


def check_params(params: dict, model, *, finite: bool = False) -> np.dtype:
    """The one check of a model's parameters: refuse missing or unexpected names, wrong shapes, mixed
    or non-float dtypes and (``finite``) NaN or infinity; return their dtype (that of the first name).

    ``model``: a :class:`TransformerConfig`, or the ``{name: shape}`` of a model of two stacks
    (:func:`core.model.transformer_encdec.param_shapes`). A 2-D weight may be a
    :class:`~core.model.compact.CompactMatrix` (a quantised checkpoint's, widened on use): its
    ``shape`` and ``dtype`` (those it widens to) are checked as an array's. ``finite=False`` by default: every forward
    pass refuses non-finite activations, and a scan of GPT-2's 124M parameters would cost more than a
    token's forward pass; the small models we train scan (``finite=True``)."""
    shapes = param_shapes(model) if isinstance(model, TransformerConfig) else model
    some = lambda names: ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")  # noqa: E731
    if not isinstance(params, dict):
        raise ValueError("params must be a dict of arrays, as init_params returns.")
    missing = [name for name in shapes if name not in params]
    if missing:
        raise ValueError(f"params lacks {len(missing)} parameter(s) this configuration needs: "
                         f"missing {some(missing)}.")
    extra = [name for name in params if name not in shapes]
    if extra:
        raise ValueError(f"Unexpected parameters {some(extra)}: this configuration does not use them.")
    first = next(iter(shapes))
    top = params[first]
    dtype = np.dtype(top.dtype if isinstance(top, CompactMatrix) else np.asarray(top).dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype} for {first!r}.")
    for name, shape in shapes.items():
        value = params[name]
        if isinstance(value, CompactMatrix) and len(shape) != 2:
            raise ValueError(f"Parameter {name!r} is a compact matrix, but it is a vector of shape {shape}: "
                             f"give it as a NumPy array (only 2-D weights may be kept compact).")
        if not isinstance(value, (np.ndarray, CompactMatrix)):
            raise ValueError(f"Parameter {name!r} is not a NumPy array.")
        if tuple(value.shape) != shape:
            raise ValueError(f"Parameter {name!r} has shape {tuple(value.shape)}; this configuration needs {shape}.")
        if value.dtype != dtype:
            raise ValueError(f"Parameter {name!r} is {value.dtype} but {first!r} is {dtype}; use one dtype.")
        if finite and not np.isfinite(wide(value)).all():
            raise ValueError(f"Parameter {name!r} contains NaN or infinity.")
    return dtype


def check_tokens(tokens, cfg: TransformerConfig, start: int = 0) -> np.ndarray:
    """Token ids as int64 ``(B, T)`` (:func:`params.check_tokens`: a 1-D ``(T,)`` becomes one
    sequence); with a KV cache already holding ``start`` positions, room for ``T`` more after them."""
    ids = P.check_tokens(tokens, cfg.vocab_size, cfg.n_ctx, "The tokens", length_name="n_ctx")
    if start + ids.shape[1] > cfg.n_ctx:
        raise ValueError(f"The model reads at most {cfg.n_ctx} tokens; {start} are cached and "
                         f"{ids.shape[1]} more would need {start + ids.shape[1]}.")
    return ids
