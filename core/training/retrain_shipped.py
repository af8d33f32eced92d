"""``python -m core.training.retrain_shipped``: train the default models shipped with the app again,
on the compiled step, and rewrite their files (:mod:`core.training.shipped`).

    python -m core.training.retrain_shipped                   # encoder.npz and induction.npz
    python -m core.training.retrain_shipped induction.npz     # that one alone

Run it after changing a default run's settings; ``tests/training/test_retrain_shipped.py`` trains
both again and checks they still match the files.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from core.training import encoder_runs, induction_runs, shipped

FILES = (shipped.ENCODER_FILE, shipped.INDUCTION_FILE)


def write(which: tuple[str, ...] = FILES, folder: str = shipped.FOLDER) -> None:
    """Train the default runs of the files in ``which`` again on the compiled step and write them
    into ``folder`` (the shipped files themselves unless told otherwise)."""
    os.makedirs(folder, exist_ok=True)
    if shipped.ENCODER_FILE in which:
        spec = encoder_runs.EncoderRun()
        model = encoder_runs.train_default(spec.task, spec.seed, track="compiled")
        shipped.save(os.path.join(folder, shipped.ENCODER_FILE), model.params,
                     {"settings": dataclasses.asdict(spec), "track": "compiled"})
    if shipped.INDUCTION_FILE in which:
        setup = induction_runs.InductionSetup()
        run = induction_runs.train_induction(setup, seed=0, track="compiled")
        shipped.save(os.path.join(folder, shipped.INDUCTION_FILE), run.params,
                     {"settings": {**dataclasses.asdict(setup), "seed": 0}, "track": "compiled",
                      "train_seconds": run.train_seconds, "losses": [float(x) for x in run.losses]})


def main(argv: list[str]) -> int:
    names = tuple(argv) or FILES
    unknown = set(names) - set(FILES)
    if unknown:
        print(f"unknown file {sorted(unknown)[0]!r}: {' or '.join(FILES)}", file=sys.stderr)
        return 1
    write(names)
    print(f"wrote {' and '.join(names)} in {shipped.FOLDER}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
