"""The tiny encoder's settings and parameters: :class:`EncoderConfig`, the names and shapes of its
parameters (the flat buffer's order), where each starts in that buffer (:func:`layout`), the
positions added to the embeddings, and the checks of parameters, tokens and labels."""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from core.model import params as P
from core.model.compiled import sublayers
from core.model.compiled.sublayers import LAYER_PARAMS
from core.model.layers import sinusoid_table
from core.validate import check_heads


POSITIONAL_CHOICES = P.POSITIONAL_CHOICES


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the tiny encoder; checked on creation (``ValueError`` in the user's terms)."""

    vocab_size: int = 10
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    n_classes: int = 2
    positional: str = "sinusoidal"
    ln_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "d_ff", "n_layers", "n_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2 for a classifier, got {self.n_classes}.")
        check_heads(self.d_model, self.n_heads)
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL_CHOICES)}, "
                             f"got {self.positional!r}.")
        if not (isinstance(self.ln_eps, (int, float)) and math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a small positive number, got {self.ln_eps!r}.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


def param_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order."""
    d, V, T, F, C = cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.d_ff, cfg.n_classes
    shapes: dict[str, tuple[int, ...]] = {"embed": (V, d)}
    if cfg.positional == "learned":
        shapes["pos"] = (T, d)
    per_layer = {"W_Q": (d, d), "W_K": (d, d), "W_V": (d, d), "W_O": (d, d),
                 "b_Q": (d,), "b_K": (d,), "b_V": (d,), "b_O": (d,),
                 "ln1_g": (d,), "ln1_b": (d,), "ln2_g": (d,), "ln2_b": (d,),
                 "W_1": (d, F), "b_1": (F,), "W_2": (F, d), "b_2": (d,)}
    for i in range(cfg.n_layers):
        for name in LAYER_PARAMS:
            shapes[f"layers.{i}.{name}"] = per_layer[name]
    shapes["W_cls"] = (d, C)
    shapes["b_cls"] = (C,)
    return shapes


@functools.lru_cache(maxsize=64)
def param_count(cfg: EncoderConfig) -> int:
    """Number of trainable numbers in the model."""
    return P.count(param_shapes(cfg))


def init_params(cfg: EncoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters: weights ``N(0, 1/d_in)``, embeddings ``N(0, 1)``, learned positions
    ``N(0, 0.1^2)``, biases 0, layer-norm gains 1 (deterministic for a seed)."""
    return P.init_by_name(param_shapes(cfg), seed, dtype)


def positional_table(params: dict, cfg: EncoderConfig, T: int) -> np.ndarray:
    """The (T, d) table added to the embeddings: sinusoidal, the learned ``pos`` rows, or zeros."""
    dtype = params["embed"].dtype
    if cfg.positional == "learned":
        return params["pos"][:T]
    return _fixed_table(cfg.positional, T, cfg.d_model, dtype.str)


@functools.lru_cache(maxsize=64)
def _fixed_table(kind: str, T: int, d: int, dtype_str: str) -> np.ndarray:
    """The sinusoidal table (:func:`core.model.layers.sinusoid_table`) or zeros; read-only."""
    if kind == "sinusoidal":
        return sinusoid_table(T, d, dtype_str)
    table = np.zeros((T, d), dtype=np.dtype(dtype_str))
    table.setflags(write=False)
    return table


@functools.lru_cache(maxsize=64)
def layout(cfg: EncoderConfig) -> sublayers.Layout:
    """Where each parameter of ``cfg`` starts in a flat buffer packed in ``param_shapes`` order."""
    offsets = _offsets(cfg)
    top = np.array([offsets["embed"], offsets.get("pos", -1), offsets["W_cls"], offsets["b_cls"]], dtype=np.int64)
    layers = np.array([[offsets[f"layers.{i}.{name}"] for name in LAYER_PARAMS] for i in range(cfg.n_layers)],
                      dtype=np.int64).reshape(cfg.n_layers, len(LAYER_PARAMS))
    top.setflags(write=False)
    layers.setflags(write=False)
    return sublayers.Layout(cfg.vocab_size, cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_classes,
                    cfg.positional == "learned", top, layers)


def flatten(params: dict, cfg: EncoderConfig) -> np.ndarray:
    """The parameters copied into one flat buffer in ``param_shapes`` order (see :func:`layout`)."""
    return np.concatenate([np.ravel(params[name]) for name in param_shapes(cfg)])


def _pe_for(flat: np.ndarray, cfg: EncoderConfig, T: int) -> np.ndarray:
    """The (T, d) positional table for a flat buffer (for learned positions, a view of it)."""
    if cfg.positional == "learned":
        at = int(layout(cfg).top[sublayers.POS])
        view = flat[at:at + T * cfg.d_model].reshape(T, cfg.d_model)
        view.setflags(write=False)        # read-only like the fixed tables: one compiled signature
        return view
    return _fixed_table(cfg.positional, T, cfg.d_model, flat.dtype.str)


@functools.lru_cache(maxsize=64)
def _offsets(cfg: EncoderConfig) -> dict:
    """Each parameter's first index in the flat buffer (``param_shapes`` order)."""
    return P.offsets(param_shapes(cfg))


def check_params(params: dict, cfg: EncoderConfig) -> np.dtype:
    """Refuse missing/extra names, wrong shapes, mixed or non-float dtypes, NaN/inf. Returns the dtype."""
    return P.check_params(params, param_shapes(cfg))


def check_tokens(tokens, cfg: EncoderConfig) -> np.ndarray:
    """Tokens as a C-contiguous int64 (B, T) array with ``1 <= T <= seq_len`` and ids in range."""
    return P.check_tokens(tokens, cfg.vocab_size, cfg.seq_len, "Tokens", length_name="seq_len")


def check_labels(labels, batch: int, cfg: EncoderConfig) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.dtype.kind not in "iu" or arr.shape != (batch,):
        raise ValueError(f"Labels must be {batch} whole-number class ids, got {arr.dtype} with shape {arr.shape}.")
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.n_classes):
        raise ValueError(f"Labels must lie in 0..{cfg.n_classes - 1}.")
    return np.ascontiguousarray(arr, dtype=np.int64)
