"""Checkpoint formats: one module per family, registered below by the ``model_type`` its
``config.json`` carries, and each the only place that knows that family's tensor names, layouts and
config. :mod:`core.model.pretrained` finds the files, reads them, and asks the format to translate.

A format module holds::

    MODEL_TYPE                         the config.json model_type it reads ("gpt2")
    FAMILY                             the family as a message names it
    config_from(hf) -> TransformerConfig                 its config.json as our config, or a ValueError
    params_from(tensors, cfg, dtype) -> (cfg, params)    its tensors (its names) as our vocabulary; the
                                       config again, refined by what the tensors hold (BERT's pooler)
    in_model(name) -> bool             whether a tensor of the file is one the model runs (for the count)

and, for a family that is also written (GPT-2),
``to_checkpoint(params, cfg) -> (config.json, tensors)``. Adding a family is one new module and
one line in :data:`FORMATS`.

Our own older ``.npz`` weight files carry no ``model_type``: their names are translated by
:mod:`core.model.formats.legacy_npz`, which :mod:`core.model.encoder_io` reads.
"""
from __future__ import annotations

from core.model.formats import bert, distilbert, gpt2, llama

FORMATS = {f.MODEL_TYPE: f for f in (gpt2, distilbert, llama, bert)}


def families() -> str:
    """The registered families, for a message: "the GPT-2 family (...), ... and the BERT family (...)"."""
    names = [f.FAMILY for f in FORMATS.values()]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def for_config(hf: dict):
    """The format that reads this ``config.json``; a ValueError naming the registered ones otherwise."""
    model_type = hf.get("model_type")
    if model_type not in FORMATS:
        raise ValueError(f"This is a {model_type or 'unnamed'} model: only {families()} can be loaded here.")
    return FORMATS[model_type]


def writer(model_type: str):
    """The format that writes ``model_type`` checkpoints; a ValueError naming those that can."""
    fmt = FORMATS.get(model_type)
    if fmt is None or not hasattr(fmt, "to_checkpoint"):
        written = ", ".join(repr(k) for k, f in FORMATS.items() if hasattr(f, "to_checkpoint"))
        raise ValueError(f"Checkpoints are written here in the {written} format, not {model_type!r}.")
    return fmt
