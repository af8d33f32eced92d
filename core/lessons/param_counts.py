"""Parameter counts: one multi-head attention block, a feed-forward sublayer, LayerNorms, a whole
Transformer block, whole models read off their configs (published ones, with presets to check them
against), and the lesson's toy count of packed projections.

Counts follow the packed layout of the project (``W_Q, W_K, W_V, W_O`` all ``d_model x d_model``
when ``d_k = d_v = d_model / H``) and the original Transformer block: attention, a two-layer
feed-forward network, and LayerNorms (a gain and a bias each). Plain arithmetic on shapes; a whole
model is described by the one transformer's settings (:class:`~core.model.config.TransformerConfig`,
two of them for an encoder-decoder: :class:`WholeModel`), so the formulas count exactly the arrays
its config builds. The attention counts are also importable from :mod:`core.lessons.analysis`, as
the pages and the public API use them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from core.model.config import TransformerConfig
from core.model.norms import NORMS
from core.model.transformer_encdec import EncoderDecoderConfig
from core.validate import as_float_array, check_heads

# ---------------------------------------------------------------------------------------------
# parameter counts of the pieces
# ---------------------------------------------------------------------------------------------


def mha_param_shapes(d_model: int, n_heads: int, bias: bool = False) -> dict[str, tuple[int, ...]]:
    """Shapes of every array of one multi-head attention block, head by head.

    ``W_Q^h, W_K^h, W_V^h`` are ``(d_model, d_k)``; ``W_O`` is ``(H d_v, d_model)``; with ``bias``
    each projection also has a bias (``(d_k,)`` per head, ``(d_model,)`` for the output).
    """
    d_k = check_heads(d_model, n_heads)
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(n_heads):
        for proj in ("Q", "K", "V"):
            shapes[f"W_{proj}^{h + 1}"] = (d_model, d_k)
            if bias:
                shapes[f"b_{proj}^{h + 1}"] = (d_k,)
    shapes["W_O"] = (n_heads * d_k, d_model)
    if bias:
        shapes["b_O"] = (d_model,)
    return shapes


def mha_param_count(d_model: int, n_heads: int, bias: bool = False, n_kv_heads: int | None = None) -> int:
    """Parameters of one multi-head attention block.

    ``3 d_model^2`` (``W_Q, W_K, W_V``, every head together) ``+ d_model^2`` (``W_O``) ``= 4 d_model^2``,
    plus ``4 d_model`` with biases. ``n_heads`` does not appear: more heads means narrower heads
    (``d_k = d_model / H``), not more weights. ``n_heads`` must divide ``d_model``.

    With grouped-query attention (``n_kv_heads`` key/value heads shared by the ``n_heads`` query
    heads; None: one each) ``W_K`` and ``W_V`` are ``d_model x H_kv d_k``: ``2 d^2 + 2 d H_kv d_k``,
    plus ``2 d + 2 H_kv d_k`` with biases.
    """
    d_k = check_heads(d_model, n_heads)
    if n_kv_heads is None or n_kv_heads == n_heads:
        return 4 * d_model * d_model + (4 * d_model if bias else 0)
    if int(n_kv_heads) != n_kv_heads or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"The key/value heads must be a whole number that divides the {n_heads} query heads, "
                         f"got {n_kv_heads}.")
    kv_width = int(n_kv_heads) * d_k                                 # W_K's and W_V's columns
    return 2 * d_model * d_model + 2 * d_model * kv_width + ((2 * d_model + 2 * kv_width) if bias else 0)


def mha_param_count_of_width(d_model: int, n_heads: int, d_k: int, bias: bool = False) -> int:
    """Parameters of multi-head attention whose ``H`` heads are each ``d_k`` wide, whatever ``d_model``.

    ``W_Q, W_K, W_V`` are ``(d_model, H d_k)`` and ``W_O`` is ``(H d_k, d_model)``: ``4 d_model H d_k``
    weights, plus ``3 H d_k + d_model`` biases. When the heads split the model's width
    (``H d_k = d_model``) this is :func:`mha_param_count`; otherwise the heads' concatenation is
    wider (or narrower) than ``d_model``, as in exercise 5 read with ``d_model`` kept.
    """
    for name, v in (("d_model", d_model), ("n_heads", n_heads), ("d_k", d_k)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v}.")
    width = int(n_heads) * int(d_k)                                  # the heads' concatenation
    return 4 * int(d_model) * width + ((3 * width + int(d_model)) if bias else 0)


def ffn_param_count(d_model: int, d_ff: int, bias: bool = True, gated: bool = False) -> int:
    """Parameters of the position-wise feed-forward network ``relu(x W_1 + b_1) W_2 + b_2``.

    ``2 d_model d_ff`` weights, plus ``d_ff + d_model`` biases. Gated (Llama's SwiGLU,
    ``(act(x W_gate) * (x W_1)) W_2``), a third matrix: ``3 d_model d_ff``, plus ``2 d_ff + d_model``.
    """
    n_in = 2 if gated else 1                                        # W_1, and W_gate beside it
    return (n_in + 1) * d_model * d_ff + ((n_in * d_ff + d_model) if bias else 0)


def norms_label(norm: str) -> str:
    """How a table names a model's norms: "RMSNorms" (a gain each) or "LayerNorms" (a gain and a bias)."""
    return "RMSNorms" if norm == "rmsnorm" else "LayerNorms"


def layernorm_param_count(d_model: int, n: int = 1, norm: str = "layernorm") -> int:
    """``n`` norms of width ``d_model``: LayerNorms, a gain and a bias each, ``2 n d_model``; another
    kind of norm (:data:`core.model.norms.NORMS`) has its own vectors (RMSNorm a gain only: ``n d_model``)."""
    return n * len(NORMS[norm].params) * d_model


@dataclass(frozen=True)
class BlockParams:
    """Parameters of one Transformer layer, by sublayer."""

    self_attention: int
    cross_attention: int
    ffn: int
    layernorms: int

    @property
    def total(self) -> int:
        return self.self_attention + self.cross_attention + self.ffn + self.layernorms


def block_param_count(d_model: int, n_heads: int, d_ff: int, *, cross_attention: bool = False,
                      bias: bool = True, norm: str = "layernorm", n_kv_heads: int | None = None,
                      gated_ffn: bool = False) -> BlockParams:
    """Parameters of one layer: attention, FFN and LayerNorms.

    Encoder layer (and a decoder-only layer): ``4 d^2 (+4d) + 2 d d_ff (+d_ff + d) + 2 * 2d``.
    Decoder layer of an encoder-decoder model adds cross-attention and a third LayerNorm:
    ``+ 4 d^2 (+4d) + 2d``. An attention-only layer (``d_ff = 0``) has no FFN and no second norm.
    A Llama layer: its self-attention's key/value heads are ``n_kv_heads`` (:func:`mha_param_count`),
    its FFN gated (:func:`ffn_param_count`), its norms RMSNorms (a gain each).
    """
    n_norms = (2 if d_ff else 1) + (1 if cross_attention else 0)
    return BlockParams(self_attention=mha_param_count(d_model, n_heads, bias, n_kv_heads),
                       cross_attention=mha_param_count(d_model, n_heads, bias) if cross_attention else 0,
                       ffn=ffn_param_count(d_model, d_ff, bias, gated_ffn) if d_ff else 0,
                       layernorms=layernorm_param_count(d_model, n_norms, norm))


# ---------------------------------------------------------------------------------------------
# whole models, counted from their configs
# ---------------------------------------------------------------------------------------------

ARCHITECTURES = ("encoder-only", "decoder-only", "encoder-decoder")
POSITIONAL = ("sinusoidal", "learned")      # the calculator's choices: fixed (no parameters) or learned


@dataclass(frozen=True)
class WholeModel:
    """A whole model to count, as the one transformer's settings.

    ``stack``: the :class:`~core.model.config.TransformerConfig` of its one stack (an encoder, a
    decoder-only model), or of an encoder-decoder's target stack; ``encoder``: an encoder-decoder's
    source stack (None for one stack); ``shared_embeddings``: the two stacks read one token table
    (the original Transformer's). ``name``, ``published_total``, ``source``: a published model's name,
    its paper's count and where the paper gives it.
    """

    stack: TransformerConfig
    encoder: TransformerConfig | None = None
    shared_embeddings: bool = False
    name: str = "custom"
    published_total: int | None = None
    source: str = ""

    def __post_init__(self):
        if self.encoder is None:
            if self.shared_embeddings:
                raise ValueError("Only an encoder-decoder shares a token table: this model has one stack.")
            return
        enc, dec = self.encoder, self.stack
        if enc.causal or not dec.causal or enc.head != "none":
            raise ValueError("An encoder-decoder's source stack attends both ways and has no head (causal=False, "
                             "head='none'); its target stack attends causally.")
        if enc.d_model != dec.d_model:
            raise ValueError(f"The two stacks must share d_model, got {enc.d_model} and {dec.d_model}.")
        if self.shared_embeddings and enc.vocab_size != dec.vocab_size:
            raise ValueError(f"Stacks that share a token table share its vocabulary, got {enc.vocab_size} and "
                             f"{dec.vocab_size} tokens.")

    @property
    def stacks(self) -> tuple[TransformerConfig, ...]:
        """The stacks, the one reading the input first."""
        return (self.stack,) if self.encoder is None else (self.encoder, self.stack)

    @property
    def architecture(self) -> str:
        return "encoder-decoder" if self.encoder else "decoder-only" if self.stack.causal else "encoder-only"


def whole_model(model) -> WholeModel:
    """``model`` as a :class:`WholeModel`: a :class:`TransformerConfig` is its one stack, an
    :class:`~core.model.transformer_encdec.EncoderDecoderConfig` its two (each with its own token table)."""
    if isinstance(model, WholeModel):
        return model
    if isinstance(model, EncoderDecoderConfig):
        return WholeModel(model.decoder, model.encoder)
    return WholeModel(model)


@dataclass(frozen=True)
class ModelParams:
    """A model's parameter count, part by part (``parts`` keeps a readable order), and the total."""

    parts: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def rows(self) -> list[tuple[str, int, float]]:
        """``(part, count, share of total)`` for a table."""
        return [(k, v, v / self.total if self.total else 0.0) for k, v in self.parts.items()]


def model_param_count(model) -> ModelParams:
    """Parameters of a whole model (a :class:`WholeModel`, or a config: :func:`whole_model`), part by part.

    - token embeddings: ``V d`` (twice for an encoder-decoder that does not share them);
    - positions: 0 for sinusoidal (or none), ``n_ctx * d`` per stack when learned;
    - segments ``n_token_types * d``; embedding LayerNorm ``2d``;
    - each encoder layer ``4d^2 + 2 d d_ff + 2 * 2d`` (+ biases ``4d + d_ff + d``); with grouped-query
      attention ``W_K, W_V`` are ``d x H_kv d_k``, a gated FFN has ``3 d d_ff``, RMSNorm a gain only
      (SmolLM2-135M: 30 layers of 3,540,096 and 28,311,552 of tied embeddings, 134,515,008 in all);
    - each decoder layer of an encoder-decoder adds cross-attention and a LayerNorm
      (``+4d^2 (+4d) + 2d``); decoder-only layers are shaped like encoder layers;
    - output projection: 0 when tied to the embedding, else ``V d`` (+ ``V`` bias);
    - final LayerNorms ``2d`` per stack; pooler ``d^2 + d``; a classifier ``d C + C``.
    """
    model = whole_model(model)
    stacks, top = model.stacks, model.stack
    d = top.d_model
    parts: dict[str, int] = {}
    # 1. embeddings
    tables = (top,) if model.shared_embeddings else stacks
    parts["token embeddings"] = sum(s.vocab_size * d for s in tables)
    parts["position embeddings"] = sum(s.n_ctx * d for s in stacks if s.positional == "learned")
    if any(s.n_token_types for s in stacks):
        parts["segment embeddings"] = sum(s.n_token_types * d for s in stacks)
    if any(s.embed_ln for s in stacks):
        parts[f"embedding {norms_label(top.norm)[:-1]}"] = sum(layernorm_param_count(d, norm=s.norm)
                                                                for s in stacks if s.embed_ln)
    # 2. the layers, sublayer by sublayer: a causal stack is a decoder
    for i, s in enumerate(stacks):
        role, cross = ("decoder" if s.causal else "encoder"), i == 1          # an encoder-decoder's target stack
        block = block_param_count(d, s.n_heads, s.d_ff, cross_attention=cross, bias=s.bias, norm=s.norm,
                                  n_kv_heads=s.n_kv_heads, gated_ffn=s.gated_ffn)
        parts[f"{role} self-attention"] = s.n_layers * block.self_attention
        if cross:
            parts[f"{role} cross-attention"] = s.n_layers * block.cross_attention
        parts[f"{role} FFN"] = s.n_layers * block.ffn
        parts[f"{role} {norms_label(s.norm)}"] = s.n_layers * block.layernorms
    if any(s.final_ln for s in stacks):
        parts[f"final {norms_label(top.norm)}"] = sum(layernorm_param_count(d, norm=s.norm) for s in stacks if s.final_ln)
    # 3. heads on top
    if top.head == "lm":
        weights = 0 if top.tied_unembed else top.vocab_size * d
        parts["output projection"] = weights + (top.vocab_size if top.unembed_b else 0)
    if any(s.pooler for s in stacks):
        parts["pooler"] = sum(d * d + d for s in stacks if s.pooler)
    if top.head == "classify":
        parts["classifier"] = d * top.n_classes + top.n_classes
    return ModelParams(parts, sum(parts.values()))


def choices(model: WholeModel) -> tuple[str, str, bool, bool]:
    """The calculator's four choices that ``model`` makes: ``(architecture, positional, lm_head, tied)``.
    A model without an output projection says tied (the original Transformer's and GPT-2's choice)."""
    top = model.stack
    return model.architecture, top.positional, top.head == "lm", top.tied_unembed or top.head != "lm"


def with_choices(model: WholeModel, architecture: str, positional: str, lm_head: bool, tied: bool) -> WholeModel:
    """``model``'s sizes made another model by the calculator's choices (:func:`choices` gives them
    back): its architecture, its positions, an output projection to the vocabulary, tied or not.

    One stack becomes an encoder-decoder's two, each with the same sizes; an encoder-decoder keeps
    its target stack for a decoder-only model and its source stack's layers for an encoder-only one.
    An encoder-decoder made here shares its token table, as the original Transformer; what a model has
    once (segments, the embedding LayerNorm, the pooler) stays on the stack that reads the input.
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"Unknown architecture {architecture!r}; choose one of {', '.join(ARCHITECTURES)}.")
    if positional not in POSITIONAL:
        raise ValueError(f"Unknown positional encoding {positional!r}; choose one of {', '.join(POSITIONAL)}.")
    top, source = model.stack, model.encoder or model.stack
    output = dict(head="lm" if lm_head else "none", tied_unembed=lm_head and tied, unembed_b=lm_head and top.unembed_b)
    stack = replace(top, positional=positional, causal=architecture != "encoder-only", **output)
    if architecture == "encoder-only":
        stack = replace(stack, n_layers=source.n_layers)
    if architecture != "encoder-decoder":
        return replace(model, stack=stack, encoder=None, shared_embeddings=False)
    encoder = replace(source, positional=positional, causal=False, head="none", tied_unembed=False, unembed_b=False)
    if model.encoder is None:              # the input's pieces go to the encoder
        stack = replace(stack, n_token_types=0, embed_ln=False, pooler=False)
    return replace(model, stack=stack, encoder=encoder,
                   shared_embeddings=model.shared_embeddings if model.encoder else True)


def relative_error_to_published(model: WholeModel) -> float:
    """``(counted - published) / published`` for a preset that has a published total."""
    if not model.published_total:
        raise ValueError(f"{model.name} has no published parameter count to compare with.")
    return (model_param_count(model).total - model.published_total) / model.published_total


def _original_transformer(d_model: int, n_heads: int, d_ff: int, name: str, published_total: int) -> WholeModel:
    """The original Transformer's settings: post-norm ReLU blocks with biases, sinusoidal positions, six
    layers a stack, one token table for both stacks and the output projection."""
    target = TransformerConfig(vocab_size=37000, n_ctx=512, d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_layers=6,
                               tied_unembed=True)
    return WholeModel(target, replace(target, causal=False, head="none", tied_unembed=False), shared_embeddings=True,
                      name=name, published_total=published_total,
                      source="Vaswani et al. 2017, Attention Is All You Need, Table 3")


# Published models. The original Transformer: shared source-target BPE vocabulary of about
# 37000 tokens, one table for encoder input, decoder input and the pre-softmax projection,
# sinusoidal positions, post-norm layers; Table 3 of Vaswani et al. (2017) lists 65M and 213M.
# Counting the stated shapes gives 63.1M for base (2.9% under the table, which is rounded and
# whose exact vocabulary size is not given) and 214.2M for big (0.6% over).
TRANSFORMER_BASE = _original_transformer(512, 8, 2048, "Transformer (base)", 65_000_000)
TRANSFORMER_BIG = _original_transformer(1024, 16, 4096, "Transformer (big)", 213_000_000)
# BERT-base: WordPiece vocabulary 30522, 512 learned positions, 2 segment embeddings, a
# LayerNorm on the embeddings and a pooler; the published 110M excludes the pre-training heads.
BERT_BASE = WholeModel(
    TransformerConfig(vocab_size=30522, n_ctx=512, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                      activation="gelu_erf", positional="learned", causal=False, ln_eps=1e-12, head="none",
                      n_token_types=2, embed_ln=True, pooler=True),
    name="BERT-base", published_total=110_000_000, source="Devlin et al. 2019, BERT, Section 3")

MODEL_PRESETS: dict[str, WholeModel] = {
    "transformer_base": TRANSFORMER_BASE,
    "transformer_big": TRANSFORMER_BIG,
    "bert_base": BERT_BASE,
}


@dataclass(frozen=True)
class BlocksAndEmbeddings:
    """A model's count in three parts: its stacked blocks, its embedding tables, everything else."""

    n_blocks: int
    blocks: int
    embeddings: int
    other: int
    other_parts: tuple[str, ...] = ()   # what "other" holds (pooler, output projection, ...)


def blocks_and_embeddings(model) -> BlocksAndEmbeddings:
    """Split :func:`model_param_count` into the layers, the embeddings, and the rest.

    For BERT-base: 12 blocks of ``4d^2 + 2 d d_ff`` plus biases and LayerNorms, about 85M, plus
    about 24M of embeddings (tokens, positions, segments, their LayerNorm) and the pooler.
    """
    model = whole_model(model)
    parts = model_param_count(model).parts
    layer_parts = ("self-attention", "cross-attention", "FFN", "LayerNorms")
    in_blocks = {k for k in parts if k.split(" ", 1)[0] in ("encoder", "decoder")
                 and k.split(" ", 1)[-1] in layer_parts}
    in_embeddings = {k for k in parts if "embedding" in k}
    other = [k for k, v in parts.items() if k not in in_blocks | in_embeddings and v]
    return BlocksAndEmbeddings(sum(s.n_layers for s in model.stacks),
                               sum(parts[k] for k in in_blocks), sum(parts[k] for k in in_embeddings),
                               sum(parts[k] for k in other), tuple(other))


# ---------------------------------------------------------------------------------------------
# the lesson's toy count: packed projections
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedSplit:
    """Weights of one attention block, split as the lesson counts them (no biases)."""

    per_matrix: int      # one packed d_model x d_model projection
    qkv: int             # W_Q, W_K, W_V together: 3 d_model^2
    out: int             # W_O: d_model^2

    @property
    def total(self) -> int:
        return self.qkv + self.out


def packed_param_split(d_model: int, n_heads: int) -> PackedSplit:
    """``3 d^2 + d^2``, read off the per-head shapes of :func:`mha_param_shapes`.

    Head by head ``W_Q^h`` is ``(d_model, d_k)``; packed side by side, the ``H`` of them fill one
    ``d_model x (H d_k) = d_model x d_model`` matrix. For the lesson's ``d_model = 4, H = 2``:
    ``W_Q`` holds 16 numbers, ``W_Q, W_K, W_V`` hold 48 and ``W_O`` 16, 64 in all.
    """
    shapes = mha_param_shapes(d_model, n_heads, bias=False)
    size = lambda prefix: sum(int(np.prod(s)) for name, s in shapes.items() if name.startswith(prefix))  # noqa: E731
    return PackedSplit(per_matrix=size("W_Q"), qkv=size("W_Q") + size("W_K") + size("W_V"), out=size("W_O"))


def packed_slice_error(X, W_packed, per_head_W) -> float:
    """``max_h max |(X W)[:, h d_k:(h+1) d_k] - X W^h|``: one packed product against each head's own.

    ``W_packed`` is ``(d_model, H d_k)``; ``per_head_W`` is the ``H`` matrices ``(d_model, d_k)`` the
    heads were built from. 0 when head ``h`` really owns columns ``h d_k .. (h+1) d_k - 1``.
    """
    X = as_float_array(X, "X", dtype=np.float64)
    W_packed = as_float_array(W_packed, "The packed projection", dtype=np.float64)
    per_head = [as_float_array(W, "A head's projection", dtype=np.float64) for W in per_head_W]
    if not per_head or any(W.shape != per_head[0].shape for W in per_head):
        raise ValueError("Give one projection per head, all of the same shape (d_model, d_k).")
    d_k = per_head[0].shape[1]
    if W_packed.shape != (X.shape[-1], len(per_head) * d_k) or per_head[0].shape[0] != X.shape[-1]:
        raise ValueError(f"The packed projection must be (d_model, H*d_k) = ({X.shape[-1]}, {len(per_head) * d_k}), "
                         f"got {W_packed.shape}.")
    Q_all = X @ W_packed                                           # (T, H*d_k): every head at once
    return max(float(np.max(np.abs(Q_all[:, h * d_k:(h + 1) * d_k] - X @ W), initial=0.0))
               for h, W in enumerate(per_head))
