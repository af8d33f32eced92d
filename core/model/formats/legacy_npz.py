"""Our own ``.npz`` weight files from before the one vocabulary: the only place that knows their names.

They hold the same arrays as today's files (:mod:`core.model.encoder_io`) under older names::

    layers.{i}.W_Q | W_K | W_V | W_O, b_Q ... b_O   -> blocks.{i}.attn.W_Q ... b_O
    layers.{i}.ln1_g | ln1_b | ln2_g | ln2_b          -> blocks.{i}.ln1.g | ln1.b | ln2.g | ln2.b
    layers.{i}.W_1 | b_1 | W_2 | b_2                  -> blocks.{i}.ffn.W_1 | b_1 | W_2 | b_2
    W_cls, b_cls                                      -> classifier.W, classifier.b

Same layouts (``(d_in, d_out)``, applied as ``x @ W``): only the names change. The files carry no
``model_type`` and no ``config.json``, so this format is not in the registry of
:mod:`core.model.formats`: :mod:`core.model.encoder_io` reads every ``.npz`` through it.
"""
from __future__ import annotations

import re

# The older names of a weight file: outside the blocks, and a block's array after "layers.{i}."
OLD_NAMES = {"W_cls": "classifier.W", "b_cls": "classifier.b"}
OLD_BLOCK_NAMES = {**{f"{w}_{n}": f"attn.{w}_{n}" for w in "Wb" for n in "QKVO"},
                   "ln1_g": "ln1.g", "ln1_b": "ln1.b", "ln2_g": "ln2.g", "ln2_b": "ln2.b",
                   **{f"{w}_{n}": f"ffn.{w}_{n}" for w in "Wb" for n in "12"}}
_OLD_BLOCK = re.compile(r"^layers\.(\d+)\.(\w+)$")


def new_name(name: str) -> str:
    """The one vocabulary's name for an array of an older file; any other name unchanged."""
    block = _OLD_BLOCK.match(name)
    if block and block.group(2) in OLD_BLOCK_NAMES:
        return f"blocks.{block.group(1)}.{OLD_BLOCK_NAMES[block.group(2)]}"
    return OLD_NAMES.get(name, name)


def params_from(arrays: dict) -> dict:
    """``arrays`` under the one vocabulary's names: every older name replaced, other names unchanged;
    a ValueError when a file holds one array under both its older and its new name."""
    renamed = {}
    for name, value in arrays.items():
        new = new_name(name)
        if new in renamed:
            raise ValueError(f"The parameter file holds {new!r} twice, under its older and its new name.")
        renamed[new] = value
    return renamed
