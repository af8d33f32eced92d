"""The one vocabulary's names, built in one place: a block's prefix and the entries under it.

    block(3)                          -> "blocks.3"
    block(3, "dec.")                  -> "dec.blocks.3"
    key(block(3), "attn", "weights")  -> "blocks.3.attn.weights"

A parameter (``blocks.3.attn.W_Q``) and what a forward pass leaves in its cache
(``blocks.3.attn.weights``, ``blocks.3.resid_post``) are named the same way, as TransformerLens
names its hook points; the table is in the README.
"""
from __future__ import annotations


def block(i: int, stack: str = "") -> str:
    """Block ``i``'s name, in an encoder-decoder with its stack's prefix (``"enc."``, ``"dec."``)."""
    return f"{stack}blocks.{i}"


def key(*parts: str) -> str:
    """The name of an entry: its parts joined by dots."""
    return ".".join(parts)


def per_block(cache: dict, n_layers: int, *parts: str, stack: str = "") -> list:
    """The same entry of every block, first block first: ``per_block(cache, L, "attn", "weights")``."""
    return [cache[key(block(i, stack), *parts)] for i in range(n_layers)]


def head(layer: int, index: int) -> str:
    """A head's name on every page, counted from 1: layer 3's second head (0-based ``2, 1``) is ``L3H2``."""
    return f"L{layer + 1}H{index + 1}"


def paper_head(layer: int, index: int) -> str:
    """The same head as papers write it, counted from 0: ``2.1`` (for tooltips beside :func:`head`)."""
    return f"{layer}.{index}"
