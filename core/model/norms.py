"""The norms of the one transformer: which norm (``TransformerConfig.norm``) and where it sits
(``norm_placement``), each choice a forward and a backward pass registered under its name.

Which norm, over the last axis of ``x (B, T, d)``::

    layernorm   y = g (x - mean) / sqrt(var + eps) + b        parameters g, b   (the original Transformer, GPT-2, BERT)
    rmsnorm     y = g x / sqrt(mean(x^2) + eps)               parameter g       (no centring, no bias)

Where it sits, around a sublayer ``f`` (attention or the feed-forward network) on the residual stream ``h``::

    post   h = norm(h + f(h))          the original Transformer, BERT
    pre    h = h + f(norm(h))          GPT-2: the residual stream itself is never normalised

:func:`residual` and :func:`residual_backward` are that wiring, written once for every block kind
(encoder and decoder blocks, self- and cross-attention, feed-forward). A norm's forward leaves its
statistics in the forward cache under its name (``blocks.0.ln1.mean`` ...), and its backward reads
them there. Adding a norm is a forward, a backward, one line in :data:`NORMS` and a test.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from core.model import layers as L
from core.model.tuned import forward as TF
from core.model.names import key


# ----------------------------------------------------------------------------------------------
# which norm
# ----------------------------------------------------------------------------------------------
def layer_norm(x: np.ndarray, w: dict, eps: float, cache: dict, name: str, tuned: bool = False) -> np.ndarray:
    """:func:`layers.layer_norm` (no tuned twin) with gain ``w["g"]`` and bias ``w["b"]``, leaving in the cache its
    ``{name}.input`` (B, T, d), the statistics ``{name}.mean`` and ``{name}.std`` (B, T) and the
    ``{name}.normalized`` input ``(x - mean) / std`` (B, T, d), before the gain and bias."""
    y, c = L.layer_norm(x, w["g"], w["b"], eps)
    cache[key(name, "input")] = x
    cache[key(name, "normalized")] = c["xhat"].reshape(x.shape)
    cache[key(name, "mean")] = x.mean(axis=-1)
    cache[key(name, "std")] = (1.0 / c["rstd"]).reshape(x.shape[:-1])          # sqrt(var + eps)
    return y


def layer_norm_backward(dy: np.ndarray, w: dict, cache: dict, name: str):
    """``(dx, {"g": dg, "b": db})`` of :func:`layer_norm` ``name`` (:func:`layers.layer_norm_backward`),
    from its cache."""
    d = dy.shape[-1]
    saved = {"xhat": np.ascontiguousarray(cache[key(name, "normalized")].reshape(-1, d)),
             "rstd": np.ascontiguousarray(1.0 / cache[key(name, "std")].reshape(-1)), "g": w["g"]}
    dx, dg, db = L.layer_norm_backward(dy, saved)
    return dx, {"g": dg, "b": db}


def rms_norm(x: np.ndarray, w: dict, eps: float, cache: dict, name: str, tuned: bool = False) -> np.ndarray:
    r""":math:`y = g\,x / \mathrm{rms}(x)`, :math:`\mathrm{rms}(x) = \sqrt{\mathrm{mean}(x^2) + \epsilon}`
    over the last axis (:func:`layers.rms_norm`, or its tuned twin in a pass that runs those); leaves
    ``{name}.input``, ``{name}.rms`` (B, T) and ``{name}.normalized`` ``x / rms`` (B, T, d) in the cache."""
    rows = TF.rms_norm if tuned else L.rms_norm
    L.note(rows)
    y, xhat, rms = rows(x, w["g"], eps)                                             # (B, T, d), (B, T)
    cache[key(name, "input")], cache[key(name, "rms")], cache[key(name, "normalized")] = x, rms, xhat
    return y


def rms_norm_backward(dy: np.ndarray, w: dict, cache: dict, name: str):
    r"""``(dx, {"g": dg})`` of :func:`rms_norm` ``name``, from its cache. With :math:`\hat x = x / r`
    and :math:`\hat{dx} = dy\,g`: :math:`dx = (\hat{dx} - \hat x\,\mathrm{mean}(\hat{dx}\,\hat x)) / r`
    (LayerNorm's without the mean's term), :math:`dg = \sum dy\,\hat x` over every position."""
    xhat, rms = cache[key(name, "normalized")], cache[key(name, "rms")]
    dxhat = dy * w["g"]                                                            # (B, T, d)
    dx = (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) / rms[..., None]
    return dx, {"g": (dy * xhat).reshape(-1, dy.shape[-1]).sum(axis=0)}


@dataclasses.dataclass(frozen=True)
class Norm:
    forward: Callable        # (x, w, eps, cache, name, tuned) -> y
    backward: Callable       # (dy, w, cache, name) -> (dx, {parameter: gradient})
    params: tuple            # its parameters' short names: ln1.g, ln1.b ...


NORMS = {
    "layernorm": Norm(layer_norm, layer_norm_backward, ("g", "b")),
    "rmsnorm": Norm(rms_norm, rms_norm_backward, ("g",)),
}


def forward(cfg, x: np.ndarray, p: dict, part: str, cache: dict, name: str, tuned: bool = False) -> np.ndarray:
    """The model's norm (``cfg.norm``) with the parameters ``{part}.g`` ... of ``p`` (``ln1``,
    ``ln_final`` ...), on ``x``; its entries go to the cache under ``name``. ``tuned``: the pass runs
    the tuned twins (:func:`core.model.transformer.runs_tuned`)."""
    kind = NORMS[cfg.norm]
    return kind.forward(x, {w: p[f"{part}.{w}"] for w in kind.params}, cfg.ln_eps, cache, name, tuned)


def backward(cfg, dy: np.ndarray, p: dict, part: str, cache: dict, name: str, grads: dict) -> np.ndarray:
    """The gradient of :func:`forward`'s input from ``dy``; its parameters' go into ``grads`` (``{part}.g`` ...)."""
    kind = NORMS[cfg.norm]
    dx, g = kind.backward(dy, {w: p[f"{part}.{w}"] for w in kind.params}, cache, name)
    grads.update({f"{part}.{w}": value for w, value in g.items()})
    return dx


# ----------------------------------------------------------------------------------------------
# where it sits: the residual wiring around a sublayer
# ----------------------------------------------------------------------------------------------
def post_norm(h, sublayer: Callable, norm: Callable):
    """``norm(h + f(h))``."""
    return norm(h + sublayer(h))


def post_norm_backward(dh, sublayer_backward: Callable, norm_backward: Callable):
    """Through the norm first, then the sum passes its gradient to ``h`` and through the sublayer."""
    d_sum = norm_backward(dh)
    return d_sum + sublayer_backward(d_sum)


def pre_norm(h, sublayer: Callable, norm: Callable):
    """``h + f(norm(h))``."""
    return h + sublayer(norm(h))


def pre_norm_backward(dh, sublayer_backward: Callable, norm_backward: Callable):
    """The residual passes ``dh`` on unchanged; the sublayer and then the norm add their share."""
    return dh + norm_backward(sublayer_backward(dh))


@dataclasses.dataclass(frozen=True)
class Placement:
    forward: Callable        # (h, sublayer, norm) -> h
    backward: Callable       # (dh, sublayer_backward, norm_backward) -> dh


PLACEMENTS = {"post": Placement(post_norm, post_norm_backward), "pre": Placement(pre_norm, pre_norm_backward)}


def residual(h: np.ndarray, sublayer: Callable, norm: Callable, placement: str) -> np.ndarray:
    """One sublayer ``f`` on the residual stream ``h (B, T, d)`` with its norm where ``placement``
    puts it: ``"post"``, ``norm(h + f(h))``; ``"pre"``, ``h + f(norm(h))``."""
    return PLACEMENTS[placement].forward(h, sublayer, norm)


def residual_backward(dh: np.ndarray, sublayer_backward: Callable, norm_backward: Callable,
                      placement: str) -> np.ndarray:
    """The gradient of :func:`residual`'s input ``h`` from that of its output, given the sublayer's
    and the norm's backward passes (each from the gradient of its output to that of its input)."""
    return PLACEMENTS[placement].backward(dh, sublayer_backward, norm_backward)
