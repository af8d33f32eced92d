"""The two models the practice pages open on, trained once and shipped beside the code.

"Inside a trained model" and "Induction heads" take a trained model apart. Training it where the
page opens costs 3 to 15 s on a server that has just started and still compiles its training steps;
the class waits. So the default run of each page (its default settings, seed 0) is trained ahead,
on the compiled step, and saved here as a small ``.npz``: the parameters, and the run that made them
(its settings, the track, the training time, the losses) as JSON.

A file is used only when a page asks for exactly the run it records; any other setting trains live
(:func:`load_or_train`). This module is the files' format and their lookup, and imports nothing of
the models: ``python -m core.training.retrain_shipped`` trains both again and rewrites the files
(``python -m core.training.retrain_shipped induction.npz`` that one alone);
``tests/training/test_shipped.py`` trains them again and checks they still match.
"""
from __future__ import annotations

import json
import os

import numpy as np

FOLDER = os.path.join(os.path.dirname(__file__), "shipped")
ENCODER_FILE, INDUCTION_FILE = "encoder.npz", "induction.npz"
_RUN = "run.json"                     # the array holding the run's description


def save(path: str, params: dict, run: dict) -> None:
    """Parameters under their names, and ``run`` (plain JSON values) beside them."""
    np.savez(path, **{name: np.asarray(value) for name, value in params.items()}, **{_RUN: np.array(json.dumps(run))})


def load(path: str) -> tuple[dict, dict]:
    """``(params, run)`` as :func:`save` wrote them (no pickles), the arrays read afresh at each call:
    a session may change its copy."""
    with np.load(path, allow_pickle=False) as archive:
        run = json.loads(str(archive[_RUN]))
        params = {name: archive[name] for name in archive.files if name != _RUN}
    return params, run


def find(name: str, settings: dict) -> tuple[dict, dict] | None:
    """``(params, run)`` of the shipped file ``name`` (:func:`load`) when it records exactly
    ``settings``, else None."""
    path = os.path.join(FOLDER, name)
    if not os.path.exists(path):
        return None
    params, run = load(path)
    if run["settings"] != settings:
        return None
    return params, run


def load_or_train(name: str, settings: dict, *, read, train):
    """A default model: ``read(params, run)`` of the shipped file ``name`` when it records exactly
    ``settings`` (:func:`find`), else ``train()``."""
    found = find(name, settings)
    return train() if found is None else read(*found)
