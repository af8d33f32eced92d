"""Parameter counts: one multi-head attention block, a feed-forward sublayer, LayerNorms, a whole
Transformer block, whole published models (with presets to check them against), and the lesson's
toy count of packed projections.

Counts follow the packed layout of the project (``W_Q, W_K, W_V, W_O`` all ``d_model x d_model``
when ``d_k = d_v = d_model / H``) and the original Transformer block: attention, a two-layer
feed-forward network, and LayerNorms (a gain and a bias each). Plain arithmetic on shapes; the
names are also importable from :mod:`core.lessons.analysis`, as the pages and the public API use them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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


def mha_param_count(d_model: int, n_heads: int, bias: bool = False) -> int:
    """Parameters of one multi-head attention block.

    ``3 d_model^2`` (``W_Q, W_K, W_V``, every head together) ``+ d_model^2`` (``W_O``) ``= 4 d_model^2``,
    plus ``4 d_model`` with biases. ``n_heads`` does not appear: more heads means narrower heads
    (``d_k = d_model / H``), not more weights. ``n_heads`` must divide ``d_model``.
    """
    check_heads(d_model, n_heads)
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


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


def ffn_param_count(d_model: int, d_ff: int, bias: bool = True) -> int:
    """Parameters of the position-wise feed-forward network ``relu(x W_1 + b_1) W_2 + b_2``.

    ``2 d_model d_ff`` weights, plus ``d_ff + d_model`` biases.
    """
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def layernorm_param_count(d_model: int, n: int = 1) -> int:
    """``n`` LayerNorms, each a gain and a bias of width ``d_model``: ``2 n d_model``."""
    return 2 * n * d_model


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
                      bias: bool = True) -> BlockParams:
    """Parameters of one layer: attention, FFN and LayerNorms.

    Encoder layer (and a decoder-only layer): ``4 d^2 (+4d) + 2 d d_ff (+d_ff + d) + 2 * 2d``.
    Decoder layer of an encoder-decoder model adds cross-attention and a third LayerNorm:
    ``+ 4 d^2 (+4d) + 2d``.
    """
    attn = mha_param_count(d_model, n_heads, bias)
    n_norms = 3 if cross_attention else 2
    return BlockParams(self_attention=attn,
                       cross_attention=attn if cross_attention else 0,
                       ffn=ffn_param_count(d_model, d_ff, bias),
                       layernorms=layernorm_param_count(d_model, n_norms))


# ---------------------------------------------------------------------------------------------
# whole models
# ---------------------------------------------------------------------------------------------

ARCHITECTURES = ("encoder-only", "decoder-only", "encoder-decoder")
POSITIONAL = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerSpec:
    """What a Transformer is made of, as far as its parameter count cares.

    ``n_encoder_layers`` / ``n_decoder_layers``: an encoder-only model has no decoder layers, a
    decoder-only model no encoder layers (its layers have no cross-attention).
    ``positional``: ``"sinusoidal"`` (fixed, 0 parameters) or ``"learned"`` (``max_positions x d``
    per stack). ``lm_head``: an output projection to the vocabulary exists; ``tied_output``: it
    reuses the token embedding (0 new weights). ``shared_embeddings``: encoder and decoder read
    one token table (encoder-decoder only). ``final_layernorm``: one LayerNorm after each stack
    (pre-norm models). ``pooler``: BERT's ``d x d`` dense layer on the first token.
    """

    architecture: str = "encoder-decoder"
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    vocab_size: int = 37000
    positional: str = "sinusoidal"
    max_positions: int = 512
    bias: bool = True
    lm_head: bool = True
    tied_output: bool = True
    output_bias: bool = False
    shared_embeddings: bool = True
    n_segments: int = 0
    embedding_layernorm: bool = False
    final_layernorm: bool = False
    pooler: bool = False
    name: str = "custom"
    published_total: int | None = None
    source: str = ""

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"Unknown architecture {self.architecture!r}; choose one of {', '.join(ARCHITECTURES)}.")
        if self.positional not in POSITIONAL:
            raise ValueError(f"Unknown positional encoding {self.positional!r}; choose one of {', '.join(POSITIONAL)}.")
        for name in ("d_model", "d_ff", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        check_heads(self.d_model, self.n_heads)
        enc, dec = self.n_encoder_layers, self.n_decoder_layers
        if enc < 0 or dec < 0:
            raise ValueError("Layer counts cannot be negative.")
        wants = {"encoder-only": (enc >= 1 and dec == 0), "decoder-only": (enc == 0 and dec >= 1),
                 "encoder-decoder": (enc >= 1 and dec >= 1)}[self.architecture]
        if not wants:
            raise ValueError(
                f"An {self.architecture} model needs "
                + {"encoder-only": "encoder layers and no decoder layers",
                   "decoder-only": "decoder layers and no encoder layers",
                   "encoder-decoder": "both encoder and decoder layers"}[self.architecture]
                + f"; got {enc} encoder and {dec} decoder layers.")


@dataclass(frozen=True)
class ModelParams:
    """A model's parameter count, part by part (``parts`` keeps a readable order), and the total."""

    parts: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def rows(self) -> list[tuple[str, int, float]]:
        """``(part, count, share of total)`` for a table."""
        return [(k, v, v / self.total if self.total else 0.0) for k, v in self.parts.items()]


def model_param_count(spec: TransformerSpec) -> ModelParams:
    """Parameters of a whole Transformer, part by part.

    - token embeddings: ``V d`` (twice for an encoder-decoder that does not share them);
    - positions: 0 for sinusoidal, ``max_positions * d`` per stack when learned;
    - segments ``n_segments * d``; embedding LayerNorm ``2d``;
    - each encoder layer ``4d^2 + 2 d d_ff + 2 * 2d`` (+ biases ``4d + d_ff + d``);
    - each decoder layer of an encoder-decoder adds cross-attention and a LayerNorm
      (``+4d^2 (+4d) + 2d``); decoder-only layers are shaped like encoder layers;
    - output projection: 0 when tied to the embedding, else ``V d`` (+ ``V`` bias);
    - final LayerNorms ``2d`` per stack; pooler ``d^2 + d``.
    """
    d = spec.d_model
    parts: dict[str, int] = {}
    n_stacks = (spec.n_encoder_layers > 0) + (spec.n_decoder_layers > 0)
    # 1. embeddings
    n_tables = 2 if (spec.architecture == "encoder-decoder" and not spec.shared_embeddings) else 1
    parts["token embeddings"] = n_tables * spec.vocab_size * d
    parts["position embeddings"] = (n_stacks * spec.max_positions * d
                                    if spec.positional == "learned" else 0)
    if spec.n_segments:
        parts["segment embeddings"] = spec.n_segments * d
    if spec.embedding_layernorm:
        parts["embedding LayerNorm"] = layernorm_param_count(d)
    # 2. the layers, sublayer by sublayer
    if spec.n_encoder_layers:
        enc = block_param_count(d, spec.n_heads, spec.d_ff, bias=spec.bias)
        n = spec.n_encoder_layers
        parts["encoder self-attention"] = n * enc.self_attention
        parts["encoder FFN"] = n * enc.ffn
        parts["encoder LayerNorms"] = n * enc.layernorms
    if spec.n_decoder_layers:
        cross = spec.architecture == "encoder-decoder"
        dec = block_param_count(d, spec.n_heads, spec.d_ff, cross_attention=cross, bias=spec.bias)
        n = spec.n_decoder_layers
        parts["decoder self-attention"] = n * dec.self_attention
        if cross:
            parts["decoder cross-attention"] = n * dec.cross_attention
        parts["decoder FFN"] = n * dec.ffn
        parts["decoder LayerNorms"] = n * dec.layernorms
    if spec.final_layernorm:
        parts["final LayerNorms"] = n_stacks * layernorm_param_count(d)
    # 3. heads on top
    if spec.lm_head:
        weights = 0 if spec.tied_output else spec.vocab_size * d
        parts["output projection"] = weights + (spec.vocab_size if spec.output_bias else 0)
    if spec.pooler:
        parts["pooler"] = d * d + d
    return ModelParams(parts, sum(parts.values()))


def relative_error_to_published(spec: TransformerSpec) -> float:
    """``(counted - published) / published`` for a preset that has a published total."""
    if not spec.published_total:
        raise ValueError(f"{spec.name} has no published parameter count to compare with.")
    return (model_param_count(spec).total - spec.published_total) / spec.published_total


# Published models. The original Transformer: shared source-target BPE vocabulary of about
# 37000 tokens, one table for encoder input, decoder input and the pre-softmax projection,
# sinusoidal positions, post-norm layers; Table 3 of Vaswani et al. (2017) lists 65M and 213M.
# Counting the stated shapes gives 63.1M for base (2.9% under the table, which is rounded and
# whose exact vocabulary size is not given) and 214.2M for big (0.6% over).
TRANSFORMER_BASE = TransformerSpec(
    architecture="encoder-decoder", d_model=512, n_heads=8, d_ff=2048,
    n_encoder_layers=6, n_decoder_layers=6, vocab_size=37000, positional="sinusoidal",
    lm_head=True, tied_output=True, shared_embeddings=True,
    name="Transformer (base)", published_total=65_000_000,
    source="Vaswani et al. 2017, Attention Is All You Need, Table 3")
TRANSFORMER_BIG = TransformerSpec(
    architecture="encoder-decoder", d_model=1024, n_heads=16, d_ff=4096,
    n_encoder_layers=6, n_decoder_layers=6, vocab_size=37000, positional="sinusoidal",
    lm_head=True, tied_output=True, shared_embeddings=True,
    name="Transformer (big)", published_total=213_000_000,
    source="Vaswani et al. 2017, Attention Is All You Need, Table 3")
# BERT-base: WordPiece vocabulary 30522, 512 learned positions, 2 segment embeddings, a
# LayerNorm on the embeddings and a pooler; the published 110M excludes the pre-training heads.
BERT_BASE = TransformerSpec(
    architecture="encoder-only", d_model=768, n_heads=12, d_ff=3072,
    n_encoder_layers=12, n_decoder_layers=0, vocab_size=30522, positional="learned",
    max_positions=512, lm_head=False, n_segments=2, embedding_layernorm=True, pooler=True,
    name="BERT-base", published_total=110_000_000,
    source="Devlin et al. 2019, BERT, Section 3")

def spec_of(cfg, name: str = "loaded checkpoint") -> TransformerSpec:
    """The spec of a decoder-only or encoder-only model's :class:`core.model.config.TransformerConfig`,
    so that :func:`model_param_count` counts a loaded checkpoint by the formulas above."""
    if cfg.head == "classify" or cfg.d_ff == 0:
        raise ValueError("Only a checkpoint's stack (a language model or a bare encoder, each with a "
                         "feed-forward sublayer) has a spec here.")
    encoder = not cfg.causal
    return TransformerSpec(
        architecture="encoder-only" if encoder else "decoder-only", d_model=cfg.d_model, n_heads=cfg.n_heads,
        d_ff=cfg.d_ff, n_encoder_layers=cfg.n_layers if encoder else 0, n_decoder_layers=0 if encoder else cfg.n_layers,
        vocab_size=cfg.vocab_size, positional="learned" if cfg.positional == "learned" else "sinusoidal",
        max_positions=cfg.n_ctx, bias=cfg.bias, lm_head=cfg.head == "lm", tied_output=cfg.tied_unembed,
        output_bias=cfg.unembed_b, n_segments=cfg.n_token_types, embedding_layernorm=cfg.embed_ln,
        final_layernorm=cfg.final_ln, pooler=cfg.pooler, name=name)


MODEL_PRESETS: dict[str, TransformerSpec] = {
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


def blocks_and_embeddings(spec: TransformerSpec) -> BlocksAndEmbeddings:
    """Split :func:`model_param_count` into the layers, the embeddings, and the rest.

    For BERT-base: 12 blocks of ``4d^2 + 2 d d_ff`` plus biases and LayerNorms, about 85M, plus
    about 24M of embeddings (tokens, positions, segments, their LayerNorm) and the pooler.
    """
    parts = model_param_count(spec).parts
    layer_parts = ("self-attention", "cross-attention", "FFN", "LayerNorms")
    in_blocks = {k for k in parts if k.split(" ", 1)[0] in ("encoder", "decoder")
                 and k.split(" ", 1)[-1] in layer_parts}
    in_embeddings = {k for k in parts if "embedding" in k}
    other = [k for k, v in parts.items() if k not in in_blocks | in_embeddings and v]
    return BlocksAndEmbeddings(spec.n_encoder_layers + spec.n_decoder_layers,
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
