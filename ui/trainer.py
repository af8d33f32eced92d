"""Training in the background, for the Streamlit page: a worker thread and a thread-safe record.

The page keeps one :class:`Trainer` in ``st.session_state``; ``start()`` hands the work to a
thread (:class:`ui.background_run.BackgroundRun`, which both training pages' workers share), and
the page's ``st.fragment(run_every=...)`` reads :meth:`Trainer.view` a few times a second and redraws.

    trainer = Trainer()
    trainer.start(EncoderRun(task="increasing", steps=800))     # or a list of specs: an ablation
    trainer.view().runs[0].metrics                             # grows while it trains
    trainer.pause(); trainer.resume(); trainer.reset()

One trainer runs its specs one after the other (a single run, or the runs of an ablation). Each
run is bounded by ``core.limits``: at most ``MAX_TRAIN_STEPS`` steps, and all runs together at most
``MAX_TRAIN_SECONDS`` of wall-clock time. Several runs train in turns of ``eval_every`` steps each,
so a time cap stops them all at the same step (a comparison stays between equal runs). Nothing here
imports Streamlit: tests drive it as a plain object.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import io
import time
from typing import Callable

import numpy as np

from core import limits, warmup
from core.model import encoder_io, names
from core.model.tuned import classifier
from core.model.config import TransformerConfig, check_params
from core.training import encoder_runs
from core.training.encoder_runs import EncoderRun
from core.training.tasks import Dataset, make_dataset
from ui.background_run import BUSY, DONE, LOADED, PAUSED, BackgroundRun

RATE_WINDOW = 25              # steps per second is measured over the last this-many steps


@dataclasses.dataclass
class _Run:
    """A run's live objects; only the worker thread touches ``state`` while the trainer runs."""

    spec: EncoderRun
    cfg: TransformerConfig
    data: Dataset
    state: encoder_runs.TrainState
    train: Callable                            # the training loop: encoder_runs.train or one like it
    metrics: list = dataclasses.field(default_factory=list)
    attention: np.ndarray | None = None        # (L, H, T, T) for the chosen validation example
    attention_step: int = -1
    wall_seconds: float = 0.0
    finished: bool = False
    stop_reason: str = ""
    test_acc: float | None = None
    confusion: np.ndarray | None = None


# ----------------------------------------------------------------------------------------------
# what the page reads
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunView:
    """A copy of one run's record, safe to read while the worker carries on."""

    label: str
    spec: EncoderRun
    step: int
    target_steps: int
    metrics: list                  # one dict per step: step, loss, train_acc, val_acc, elapsed, steps_per_s,
                                   # ms_per_step (training alone), track (the training step that ran)
    attention: np.ndarray | None   # (L, H, T, T)
    attention_step: int
    example_tokens: np.ndarray     # the chosen validation sequence (T,)
    example_label: int
    finished: bool
    stop_reason: str
    test_acc: float | None
    confusion: np.ndarray | None   # confusion[true, predicted]

    @property
    def last(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    @property
    def final_val_acc(self) -> float | None:
        return self.metrics[-1]["val_acc"] if self.metrics else None


@dataclasses.dataclass(frozen=True)
class TrainerView:
    status: str
    message: str
    runs: list
    example_index: int
    version: int                   # grows whenever anything changes

    @property
    def running(self) -> bool:
        return self.status in BUSY


# ----------------------------------------------------------------------------------------------
# the trainer
# ----------------------------------------------------------------------------------------------
class Trainer(BackgroundRun):
    """Runs one or more :class:`EncoderRun` in a background thread; every method is thread-safe.

    Parameters
    ----------
    max_steps, max_seconds : caps (default ``core.limits``); a spec asking for more steps is cut
        to ``max_steps``, and all runs together get ``max_seconds`` of wall-clock time.
    snapshot_every : steps between two snapshots of the attention maps (also at step 1 and at
        the end of a run).
    """

    _left_queue_status = PAUSED        # paused while it waited: it resumes from step 0

    def __init__(self, *, max_steps: int = limits.MAX_TRAIN_STEPS,
                 max_seconds: float = limits.MAX_TRAIN_SECONDS, snapshot_every: int = 25):
        self.max_steps = int(max_steps)
        self.max_seconds = float(max_seconds)
        self.snapshot_every = max(1, int(snapshot_every))
        super().__init__("encoder-trainer")
        self._runs: list[_Run] = []
        self._example = 0

    # -- control ---------------------------------------------------------------------------------
    def start(self, specs, *, train: Callable | None = None) -> None:
        """Build the data and fresh models for ``specs`` (one or a list) and start encoder_runs.

        ``train`` is the training loop, called as ``train(state, data, max_steps=, max_seconds=,
        eval_every=)`` and yielding one metrics dict per step (default
        :func:`core.training.encoder_runs.train`); a resumed run keeps the loop it started with.
        Raises ``ValueError`` (in the user's terms) for a bad spec; nothing changes then. The
        runs train once the server's training queue gives them a slot.
        """
        specs = [specs] if isinstance(specs, EncoderRun) else list(specs)
        if not specs:
            raise ValueError("Nothing to train: give at least one run.")
        self._refuse_while_running("A run is already training: pause or reset it first.")
        if train is None:   # the compiled step, or the readable one while a new server still compiles it
            train = functools.partial(encoder_runs.train, track=warmup.track(warmup.ENCODER))
        runs, datasets = [], {}
        for spec in specs:
            spec = spec.check()
            if spec.steps > self.max_steps:
                spec = dataclasses.replace(spec, steps=self.max_steps)
            cfg = spec.config()
            key = (spec.task, spec.n_train, spec.n_val, spec.n_test, spec.seed)
            if key not in datasets:
                datasets[key] = make_dataset(spec.task, spec.n_train, spec.n_val, spec.n_test, seed=spec.seed)
            data = datasets[key]
            state = encoder_runs.new_state(cfg, data, seed=spec.seed, lr=spec.lr, batch_size=spec.batch_size,
                                       decay_steps=spec.steps)
            runs.append(_Run(spec, cfg, data, state, train))
        self._claim()

        def fresh():
            self._runs = runs
            self._example = min(self._example, max(len(runs[0].data.y_val) - 1, 0))
        self._renew(fresh)
        self._launch(self._train)

    def resume(self) -> None:
        """Carry on from where :meth:`pause` stopped (or train an uploaded model further)."""
        with self._lock:
            if self._status not in (PAUSED, LOADED):
                raise ValueError(f"Nothing to resume: the trainer is {self._status}.")
        self._claim()
        self._launch(self._train)

    def pause(self, timeout: float = 10.0) -> None:
        """Stop after the current step and wait for the thread to end; the model is kept."""
        self._halt(timeout)

    def reset(self, timeout: float = 10.0) -> None:
        """Stop, and forget every run."""
        self._halt(timeout)
        self._renew(lambda: setattr(self, "_runs", []))

    def set_example(self, index: int) -> None:
        """Choose the validation sequence whose attention maps are snapshotted."""
        with self._lock:
            n = len(self._runs[0].data.y_val) if self._runs else 0
            self._example = int(np.clip(index, 0, max(n - 1, 0)))
            self._bump()
            idle = self._status not in BUSY
        if idle:   # no worker touches the parameters: refresh now
            for run in self._runs:
                self._snapshot(run)

    def load(self, params: dict, cfg: TransformerConfig, spec: EncoderRun, *, train: Callable | None = None) -> None:
        """Replace everything by a trained model (e.g. an uploaded file), evaluated on ``spec.task``;
        :meth:`resume` trains it further with ``train`` (as in :meth:`start`).

        ``params`` must already be checked against ``cfg`` (``core.model.encoder_io.load`` does it). Raises
        ``ValueError`` when the model does not fit the task's data; nothing changes then.
        """
        spec = spec.check()
        spec = dataclasses.replace(spec, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model,
                                   positional=cfg.positional)
        self._refuse_while_running("A run is training: pause or reset it before loading a model.")
        check_params(params, cfg)
        data = make_dataset(spec.task, spec.n_train, spec.n_val, spec.n_test, seed=spec.seed)
        dtype = next(iter(params.values())).dtype
        state = encoder_runs.new_state(cfg, data, seed=spec.seed, lr=spec.lr, batch_size=spec.batch_size,
                                   decay_steps=spec.steps, dtype=dtype)
        for name, value in params.items():
            state.params[name][...] = value
        run = _Run(spec, cfg, data, state, encoder_runs.train if train is None else train)
        self._evaluate(run)
        self._join()

        def loaded():
            self._runs = [run]
            self._example = min(self._example, len(data.y_val) - 1)
        self._renew(loaded, LOADED, "Loaded a trained model.")
        self._snapshot(run)

    # -- reading -----------------------------------------------------------------------------------
    def view(self) -> TrainerView:
        """A consistent copy of everything the page draws."""
        with self._lock:
            runs = []
            for run in self._runs:
                i = min(self._example, len(run.data.y_val) - 1)
                runs.append(RunView(
                    label=run.spec.label, spec=run.spec, step=run.state.step, target_steps=run.spec.steps,
                    metrics=list(run.metrics),
                    attention=None if run.attention is None else run.attention.copy(),
                    attention_step=run.attention_step,
                    example_tokens=run.data.X_val[i].copy(), example_label=int(run.data.y_val[i]),
                    finished=run.finished, stop_reason=run.stop_reason, test_acc=run.test_acc,
                    confusion=None if run.confusion is None else run.confusion.copy()))
            return TrainerView(self._status, self._message, runs, self._example, self._version)

    def params(self, index: int = 0) -> tuple[dict, TransformerConfig]:
        """A copy of run ``index``'s parameters and its config (not while training)."""
        with self._lock:
            if self._status in BUSY:
                raise ValueError("The model is still training: pause it to take a copy.")
            if not self._runs:
                raise ValueError("There is no model yet: start a run or upload one.")
            run = self._runs[index]
            return {k: v.copy() for k, v in run.state.params.items()}, run.cfg

    def weights_npz(self, index: int = 0) -> bytes:
        """Run ``index``'s parameters as ``.npz`` bytes, one array per design name, with the head
        count and the positional encoding (see :func:`core.model.encoder_io.save`)."""
        params, cfg = self.params(index)
        buffer = io.BytesIO()
        encoder_io.save(params, buffer, cfg)
        return buffer.getvalue()

    # -- the worker ----------------------------------------------------------------------------------
    def _train(self, generation: int) -> None:
        """The worker: train every run to its step count, the time cap or a pause."""
        with self._lock:
            runs = list(self._runs)
        if warmup.ready(warmup.ENCODER):  # loading (or compiling, with no warm-up) is not training: outside the clock
            with self._compiling(generation, "the compiled training step"):
                for run in runs:
                    classifier.warm_up(run.cfg, run.state.grad_flat.dtype)
        while True:
            left = [run for run in runs if not run.finished]
            if not left:
                break
            spent = sum(run.wall_seconds for run in runs)
            if spent >= self.max_seconds:
                for run in left:
                    self._finish(run, stopped_early=True, shared=len(runs) > 1)
                break
            # One run: train it to its step count or the cap. Several (an ablation): rounds of
            # ``eval_every`` steps, each run in turn, the cap checked between rounds only, so
            # whenever the cap ends them they stand at the same step: equal training runs.
            if len(runs) == 1:
                until, limit = left[0].spec.steps, left[0].wall_seconds + self.max_seconds - spent
            else:
                until, limit = min(run.state.step for run in left) + left[0].spec.eval_every, None
            for run in left:
                if not self._advance(run, min(until, run.spec.steps), limit):
                    self._set_status(generation, PAUSED)
                    return
                if run.state.step >= run.spec.steps:
                    self._finish(run, stopped_early=False, shared=len(runs) > 1)
            with self._lock:
                if not self._mine(generation):
                    return
        self._set_status(generation, DONE)

    def _advance(self, run: _Run, until: int, limit: float | None) -> bool:
        """Train ``run`` up to step ``until``, or until its wall seconds reach ``limit`` (None: no
        limit); False when a pause was asked for (the run is evaluated where it stopped)."""
        state, spec = run.state, run.spec
        if state.step == 0:
            self._snapshot(run)
        if state.step >= until or (limit is not None and run.wall_seconds >= limit):
            return True
        segment_start = time.perf_counter()
        wall_before = run.wall_seconds
        recent = collections.deque(maxlen=RATE_WINDOW + 1)
        recent.append((state.step, segment_start))
        seconds = None if limit is None else limit - wall_before
        for m in run.train(state, run.data, max_steps=until, max_seconds=seconds, eval_every=spec.eval_every):
            now = time.perf_counter()
            recent.append((m["step"], now))
            (s0, t0), (s1, t1) = recent[0], recent[-1]
            record = {"run": spec.label, "step": m["step"], "loss": float(m["loss"]),
                      "train_acc": float(m["train_acc"]),
                      "val_acc": None if m["val_acc"] is None else float(m["val_acc"]),
                      "evaluated": bool(m["evaluated"]), "elapsed": wall_before + now - segment_start,
                      "steps_per_s": (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0,
                      "ms_per_step": m.get("ms_per_step"), "track": m.get("track")}
            with self._lock:
                run.metrics.append(record)
                run.wall_seconds = record["elapsed"]
                self._bump()
            if m["step"] % self.snapshot_every == 0:
                self._snapshot(run)
            if limit is not None and run.wall_seconds >= limit:
                break
            if self._stop.is_set():
                self._snapshot(run)
                self._evaluate(run)
                return False
        return True

    def _finish(self, run: _Run, *, stopped_early: bool, shared: bool) -> None:
        """End ``run``: a validation accuracy at its last step, its test accuracy, and why it stopped."""
        state, spec = run.state, run.spec
        if stopped_early and run.metrics and not run.metrics[-1]["evaluated"]:
            # the last step may not have evaluated: do it so every run ends with a validation accuracy
            val = encoder_runs.accuracy(state, run.data.X_val, run.data.y_val)
            with self._lock:
                run.metrics[-1] = {**run.metrics[-1], "val_acc": val, "evaluated": True}
        self._snapshot(run)
        self._evaluate(run)
        cap = (f"the time cap ({self.max_seconds:.0f} s shared by the runs, which all stopped at this step)"
               if shared else f"the time cap ({self.max_seconds:.0f} s)")
        with self._lock:
            run.finished = True
            run.stop_reason = (f"stopped at step {state.step} of {spec.steps}: {cap} was reached" if stopped_early
                               else f"reached the step count ({spec.steps})")
            self._bump()

    def _snapshot(self, run: _Run) -> None:
        """Attention maps of every layer and head for the chosen validation example."""
        with self._lock:
            i = min(self._example, len(run.data.y_val) - 1)
        tokens = run.data.X_val[i:i + 1]
        _, cache = classifier.forward(run.state.params, tokens, run.cfg)
        attn = np.array([w[0] for w in names.per_block(cache, run.cfg.n_layers, "attn", "weights")],
                        dtype=np.float64)                             # (L, H, T, T)
        with self._lock:
            run.attention, run.attention_step = attn, run.state.step
            self._bump()

    def _evaluate(self, run: _Run) -> None:
        acc = encoder_runs.test_accuracy(run.state, run.data)
        table = encoder_runs.confusion_table(run.state, run.data.X_test, run.data.y_test)
        with self._lock:
            run.test_acc, run.confusion = acc, table
            self._bump()

