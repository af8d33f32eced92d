"""The decoder's settings and parameters: :class:`DecoderConfig`, the names and shapes of its
parameters in their fixed order (the flat buffer's order), and fresh parameters.

Encoder layers use the encoder's names under ``enc.`` (``enc.layers.{i}.W_Q`` ...); decoder layers
use the same names under ``dec.`` plus ``cross_W_Q ... cross_b_O`` and ``ln_cross_g, ln_cross_b`` for
cross-attention. The forward pass and training are in ``core.model.decoder``; the compiled gradient
(``core.model.decoder_step``) reads the same layout.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from core.model import params as P
from core.model.layers import ATTENTION_PARAMS
from core.validate import check_heads

POSITIONAL_CHOICES = P.POSITIONAL_CHOICES
ATTENTION = ATTENTION_PARAMS                     # W_Q W_K W_V W_O b_Q b_K b_V b_O
LAYER_PARAMS = ATTENTION + ("ln1_g", "ln1_b", "W_1", "b_1", "W_2", "b_2", "ln2_g", "ln2_b")
CROSS_PARAMS = tuple(f"cross_{name}" for name in ATTENTION) + ("ln_cross_g", "ln_cross_b")
FFN_PARAMS = ("W_1", "b_1", "W_2", "b_2", "ln2_g", "ln2_b")      # absent when d_ff == 0


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Sizes of the model; checked on creation (``ValueError`` in the user's terms).

    ``cross_attention=True`` builds an encoder-decoder, which needs ``src_vocab_size`` and
    ``src_len`` (the longest source); ``False`` builds a decoder-only language model, which has
    no source. ``tgt_len`` is the decoder's context: the most target positions it reads.
    ``bos_id``, optional, is the start token generation begins with when no prompt is given.
    ``d_ff=0`` drops the feed-forward sublayer (and its LayerNorm) from every layer: an
    attention-only model, whose layers are ``x = LN1(x + MHA(x))``.
    """

    vocab_size: int
    tgt_len: int
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    cross_attention: bool = True
    src_vocab_size: int | None = None
    src_len: int | None = None
    positional: str = "sinusoidal"
    ln_eps: float = 1e-5
    bos_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "tgt_len", "d_model", "n_heads", "d_ff", "n_layers"):
            value = getattr(self, name)
            if name == "d_ff" and P.whole(value) and value == 0:
                continue                                    # attention-only: no feed-forward sublayer
            if not P.whole(value) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        check_heads(self.d_model, self.n_heads)
        if not isinstance(self.cross_attention, (bool, np.bool_)):
            raise ValueError(f"cross_attention must be True (encoder-decoder) or False (decoder-only), "
                             f"got {self.cross_attention!r}.")
        if self.cross_attention:
            for name in ("src_vocab_size", "src_len"):
                value = getattr(self, name)
                if not P.whole(value) or value < 1:
                    raise ValueError(f"An encoder-decoder (cross_attention=True) needs {name}, a positive "
                                     f"whole number, got {value!r}.")
        elif self.src_vocab_size is not None or self.src_len is not None:
            raise ValueError("A decoder-only model (cross_attention=False) has no source: leave "
                             "src_vocab_size and src_len unset.")
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL_CHOICES)}, "
                             f"got {self.positional!r}.")
        if not (isinstance(self.ln_eps, (int, float)) and math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a small positive number, got {self.ln_eps!r}.")
        if self.bos_id is not None and not (P.whole(self.bos_id) and 0 <= self.bos_id < self.vocab_size):
            raise ValueError(f"bos_id must be a token id in 0..{self.vocab_size - 1} (or None), got {self.bos_id!r}.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


def tiny_config(cross_attention: bool = True) -> DecoderConfig:
    """The smallest model of each kind (the decoder-only one attention-only, as the induction
    model): what the warm-ups run once, since Numba's machine code depends on the dtype only."""
    cross = bool(cross_attention)
    return DecoderConfig(vocab_size=5, tgt_len=3, d_model=4, n_heads=1, d_ff=4 if cross else 0, n_layers=1,
                         cross_attention=cross, src_vocab_size=5 if cross else None, src_len=3 if cross else None,
                         bos_id=0 if cross else None)


def _layer_shapes(cfg: DecoderConfig, cross: bool) -> dict[str, tuple[int, ...]]:
    d, F = cfg.d_model, cfg.d_ff
    shapes = {name: (d, d) for name in ("W_Q", "W_K", "W_V", "W_O")}
    shapes.update({name: (d,) for name in ("b_Q", "b_K", "b_V", "b_O", "ln1_g", "ln1_b", "ln2_g", "ln2_b")})
    shapes.update({"W_1": (d, F), "b_1": (F,), "W_2": (F, d), "b_2": (d,)})
    names = list(LAYER_PARAMS)
    if cfg.d_ff == 0:                                   # attention-only: no W_1 ... b_2, no ln2
        names = [name for name in names if name not in FFN_PARAMS]
    if cross:
        shapes.update({f"cross_{name}": shapes[name] for name in ATTENTION})
        shapes.update({"ln_cross_g": (d,), "ln_cross_b": (d,)})
        names[10:10] = CROSS_PARAMS                     # in the order the sublayers run: after ln1
    return {name: shapes[name] for name in names}


def param_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order (encoder, decoder, output)."""
    d = cfg.d_model
    shapes: dict[str, tuple[int, ...]] = {}
    stacks = [("enc.", cfg.src_vocab_size, cfg.src_len, False)] if cfg.cross_attention else []
    stacks.append(("dec.", cfg.vocab_size, cfg.tgt_len, cfg.cross_attention))
    for prefix, vocab, length, cross in stacks:
        shapes[f"{prefix}embed"] = (vocab, d)
        if cfg.positional == "learned":
            shapes[f"{prefix}pos"] = (length, d)
        for i in range(cfg.n_layers):
            for name, shape in _layer_shapes(cfg, cross).items():
                shapes[f"{prefix}layers.{i}.{name}"] = shape
    shapes["W_out"] = (d, cfg.vocab_size)
    shapes["b_out"] = (cfg.vocab_size,)
    return shapes


def param_count(cfg: DecoderConfig) -> int:
    """Number of trainable numbers in the model."""
    return P.count(param_shapes(cfg))


def init_params(cfg: DecoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters, deterministic for a seed: weights ``N(0, 1/d_in)``, embeddings
    ``N(0, 1)``, learned positions ``N(0, 0.1^2)``, biases 0, layer-norm gains 1."""
    return P.init_by_name(param_shapes(cfg), seed, dtype)
