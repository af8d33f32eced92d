"""``python -m core.training``: train a model from the command line.

    python -m core.training --task sum --steps 300 --json        # the tiny encoder
    python -m core.training --task reverse --json                # a decoder task, with its defaults
    python -m core.training --task induction --json              # the induction page's default run

The last line printed is ``{"task", "steps", "val_acc", "train_seconds", "ms_per_step", "step"}``:
``train_seconds`` is the wall time of the training steps (the loop's Python included, evaluation
excluded), counted once the compiled kernels are loaded, and ``ms_per_step`` that time per step.
"""
from __future__ import annotations

import argparse
import json
import sys

from core.model.positions import POSITIONAL
from core.training.encoder_runs import confusion_table, run
from core.training.steps import DEFAULT_TRACK, TRACKS
from core.training.tasks import TASKS

INDUCTION_TASK = "induction"       # the two-layer attention-only decoder of core.training.induction_runs


def _main_induction(args) -> int:
    """Train the induction model; the result line adds the heads' scores (measured by the page's
    lesson, core.lessons.induction: this program sits above every layer of core) and the losses on
    the two kinds of next token."""
    from core.lessons import induction as lesson
    from core.training import induction_runs

    given = {k: v for k, v in (("steps", args.steps), ("lr", args.lr)) if v is not None}
    try:
        setup = induction_runs.InductionSetup(**given)       # the page's default run unless told otherwise
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run_ = induction_runs.train_induction(setup, seed=args.seed, callback=lambda step, loss: (
        step % 100 == 99 and print(f"step {step + 1:5d}  loss {loss:.4f}", flush=True)))
    m = lesson.measure(run_.params, run_.cfg, induction_runs.held_out(setup, args.seed))
    result = {"task": "induction", "steps": setup.steps, "val_acc": m.acc_repeated_segment,
              "train_seconds": run_.train_seconds, "ms_per_step": 1000.0 * run_.train_seconds / setup.steps,
              "induction_score": float(m.induction[-1].max()), "previous_token_score": float(m.previous[0].max()),
              "loss_first_occurrence": m.loss_first_occurrence, "loss_repeated_segment": m.loss_repeated_segment}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


def _main_decoder(args) -> int:
    """Train a decoder task (``core.training.decoder_runs.DEFAULTS``: reverse, sort, lm) with its
    defaults; ``--steps`` and ``--lr`` override them when given."""
    from core.training import decoder_runs

    overrides = {} if args.lr is None else {"lr": args.lr}
    try:
        run_ = decoder_runs.train_task(args.task, steps=args.steps, seed=args.seed, track=args.step, **overrides, callback=(
            lambda step, loss: step % 100 == 99 and print(f"step {step + 1:5d}  loss {loss:.4f}", flush=True)))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = decoder_runs.summary(run_) | {"step": args.step}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


def main(argv=None) -> int:
    from core.training.decoder_runs import DEFAULTS as DECODER_TASKS

    parser = argparse.ArgumentParser(prog="python -m core.training", description="Train the tiny encoder "
                                     "(or a decoder: reverse, sort, lm).")
    parser.add_argument("--task", default="sum", choices=sorted(TASKS) + [INDUCTION_TASK] + sorted(DECODER_TASKS))
    parser.add_argument("--steps", type=int, default=None, help="default 300 (a decoder task or induction: its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None, help="default 3e-3 (a decoder task or induction: its own)")
    parser.add_argument("--positional", default="sinusoidal", choices=POSITIONAL)
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--step", default=DEFAULT_TRACK, choices=TRACKS,
                        help="the training step: readable (the code the pages show) or compiled (its fast twin)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of results")
    args = parser.parse_args(argv)

    def report(m):
        if m["evaluated"]:
            print(f"step {m['step']:5d}  loss {m['loss']:.4f}  train_acc {m['train_acc']:.3f}  "
                  f"val_acc {m['val_acc']:.3f}  {m['elapsed']:.2f} s", flush=True)

    if args.task in DECODER_TASKS:
        return _main_decoder(args)
    if args.task == INDUCTION_TASK:
        return _main_induction(args)
    args.steps = 300 if args.steps is None else args.steps
    args.lr = 3e-3 if args.lr is None else args.lr
    try:
        result = run(args.task, args.steps, seed=args.seed, lr=args.lr, positional=args.positional,
                     max_seconds=args.max_seconds, on_metrics=report, track=args.step)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = {k: result[k] for k in ("task", "steps", "val_acc", "train_seconds", "ms_per_step")} | {"step": args.step}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"test accuracy {result['test_acc']:.4f}")
        print(confusion_table(result["state"], result["data"].X_test, result["data"].y_test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
