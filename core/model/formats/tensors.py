"""A checkpoint's tensors by the checkpoint's own names, each read once: in the precision the model
runs in, checked against the shape its ``config.json`` implies, and refused in the checkpoint's
own terms (its tensor's name, its config's sizes) when it is missing or misshaped."""
from __future__ import annotations

import numpy as np


class Tensors:
    """``tensors`` (name -> array, as read from ``model.safetensors``) for one family's reader.

    ``prefix`` is the head model's name for the body (``transformer.`` in ``GPT2LMHeadModel``,
    ``bert.`` in ``BertForMaskedLM``): keys with and without it read the same. ``family`` names
    the checkpoint in messages ("GPT-2", "BERT").
    """

    def __init__(self, tensors: dict, family: str, dtype, prefix: str = ""):
        self.t = {k.removeprefix(prefix): v for k, v in tensors.items()} if prefix else dict(tensors)
        self.family, self.dtype = family, np.dtype(dtype)

    def __contains__(self, name: str) -> bool:
        return name in self.t

    def raw(self, name: str, shape: tuple, *aliases: str) -> np.ndarray:
        """The tensor ``name`` (or the first of ``aliases`` the file holds) as stored, of ``shape``."""
        for key in (name, *aliases):
            if key in self.t:
                value = np.asarray(self.t[key])
                break
        else:
            raise ValueError(f"The weights have no tensor {name!r}: this is not a complete {self.family} checkpoint.")
        if value.shape != tuple(shape):
            raise ValueError(f"The weights' tensor {key!r} has shape {value.shape}, but config.json's sizes make it "
                             f"{tuple(shape)}: the weights and config.json belong to different models.")
        return value

    def get(self, name: str, shape: tuple, *aliases: str) -> np.ndarray:
        """:meth:`raw`, in the model's precision (no copy when it already is)."""
        return self.raw(name, shape, *aliases).astype(self.dtype, copy=False)

    def linear(self, name: str, d_in: int, d_out: int) -> np.ndarray:
        """PyTorch's ``nn.Linear`` weight, stored ``(d_out, d_in)`` for ``x W^T``, as our ``(d_in, d_out)``
        for ``x @ W``: transposed once, here."""
        return np.ascontiguousarray(self.get(name, (d_out, d_in)).T)

    def layer_norm(self, prefix: str, d: int) -> tuple[np.ndarray, np.ndarray]:
        """A ``nn.LayerNorm``'s gain and bias (``weight``, ``bias``; early BERT checkpoints say ``gamma``, ``beta``)."""
        return self.get(prefix + ".weight", (d,), prefix + ".gamma"), self.get(prefix + ".bias", (d,), prefix + ".beta")

    def block(self, layer: str, block: str, linears: dict, norms: dict, shapes: dict) -> dict:
        """One block of a BERT-like encoder: its ``nn.Linear`` layers (``linears``: their name -> ours,
        e.g. ``"attention.self.query": "attn.W_Q"``) as weight and bias, and its LayerNorms (``norms``:
        their name -> ours, e.g. ``"output.LayerNorm": "ln2"``), under ``block`` (``blocks.3.``) in our
        vocabulary; ``shapes`` our block's shapes (:func:`core.model.config.block_shapes`)."""
        p = {}
        for theirs, ours in linears.items():
            d_in, d_out = shapes[ours]
            p[block + ours] = self.linear(layer + theirs + ".weight", d_in, d_out)      # (out, in) -> (in, out)
            p[block + ours.replace("W_", "b_")] = self.get(layer + theirs + ".bias", (d_out,))
        for theirs, ours in norms.items():
            p[block + ours + ".g"], p[block + ours + ".b"] = self.layer_norm(layer + theirs, shapes[ours + ".g"][0])
        return p
