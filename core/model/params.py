"""Parameters of every model kind, in one place: their flat layout and initialisation, and the check
of token ids (parameters are checked against their model: :func:`core.model.config.check_params`).

A model's parameters are a ``dict[str, np.ndarray]`` whose names and shapes come from its
``param_shapes(cfg)``, in a fixed order. Training copies them into one flat buffer in that order
(:func:`pack`, :func:`offsets`), so that one Adam call updates them all and a compiled step can
find each array by its offset.
"""
from __future__ import annotations

import math

import numpy as np


def whole(value) -> bool:
    """A whole number (a Python or NumPy integer; not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def offsets(shapes: dict) -> dict[str, int]:
    """Where each array of ``{name: shape}`` starts in a flat buffer packed in that order."""
    at, where = 0, {}
    for name, shape in shapes.items():
        where[name] = at
        at += math.prod(shape)
    return where


def count(shapes: dict) -> int:
    """Number of trainable numbers in ``{name: shape}``."""
    return int(sum(math.prod(shape) for shape in shapes.values()))


def named_views(flat: np.ndarray, shapes: dict) -> dict[str, np.ndarray]:
    """A flat buffer packed in ``{name: shape}`` order as ``{name: view}``: writing a view writes the
    buffer, so one update of the buffer (Adam's) updates every parameter."""
    if flat.size != count(shapes):
        raise ValueError(f"The flat buffer holds {flat.size} numbers; these parameters need {count(shapes)}.")
    return {name: flat[at:at + math.prod(shape)].reshape(shape)
            for (name, shape), at in zip(shapes.items(), offsets(shapes).values())}


def pack(params: dict) -> tuple[np.ndarray, dict]:
    """Copy parameters into one flat buffer, in the dict's order; return it and its
    :func:`named_views` (the same names)."""
    shapes = {name: np.shape(value) for name, value in params.items()}
    flat = np.empty(count(shapes), dtype=next(iter(params.values())).dtype)
    views = named_views(flat, shapes)
    for name, value in params.items():
        views[name][...] = value
    return flat, views


def init_by_name(shapes: dict, seed: int, dtype) -> dict[str, np.ndarray]:
    """Fresh parameters for ``{name: shape}`` in the one vocabulary, deterministic for a seed, drawn
    in the dict's order and chosen by each name's last part: token tables (``embed``,
    ``token_type``) ``N(0, 1)``, learned positions (``pos``) ``N(0, 0.1^2)``, weights (``W_Q`` ...
    ``W_2``, ``classifier.W``, ``pooler.W``, ``unembed``) ``N(0, 1/d_in)``, norm gains (``g``) 1,
    everything else (biases, norm shifts) 0."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype}.")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        short = name.rsplit(".", 1)[-1]
        if short in ("embed", "token_type"):
            value = rng.standard_normal(shape)
        elif short == "pos":
            value = 0.1 * rng.standard_normal(shape)
        elif short.startswith("W") or short == "unembed":
            value = rng.standard_normal(shape) / math.sqrt(shape[0])
        elif short == "g":
            value = np.ones(shape)
        else:
            value = np.zeros(shape)
        params[name] = np.ascontiguousarray(value, dtype=dtype)
    return params


def check_tokens(tokens, vocab_size: int, max_len: int, what: str = "Tokens", *,
                 length_name: str | None = None) -> np.ndarray:
    """Token ids ``(T,)`` or ``(B, T)`` as a C-contiguous int64 ``(B, T)`` array, with ids in
    ``0..vocab_size-1`` and ``1 <= T <= max_len`` (the setting ``length_name``, named in the message
    when given). Floats holding whole numbers are taken as ids."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        raise ValueError(f"{what} is empty: give at least one token.")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{what} must be whole-number token ids, got values of type {arr.dtype}.")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{what} must be one sequence (T,) or a batch (B, T), got shape {np.shape(tokens)}.")
    if arr.shape[1] > max_len:
        setting = f" ({length_name} = {max_len})" if length_name else ""
        raise ValueError(f"{what} has {arr.shape[1]} positions, longer than the model's context of "
                         f"{max_len}{setting}.")
    if arr.min() < 0 or arr.max() >= vocab_size:
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise ValueError(f"{what} holds the id {bad}, outside the vocabulary 0..{vocab_size - 1}.")
    return np.ascontiguousarray(arr, dtype=np.int64)
