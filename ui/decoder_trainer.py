"""Training a decoder in the background, for the page "Decoder and generation".

The same worker as :mod:`ui.trainer`'s (:class:`ui.background_run.BackgroundRun`, with the
server-wide training slots): the page keeps one :class:`DecoderTrainer` in ``st.session_state``;
``start()`` hands the run to a thread, which only appends to lists behind a lock, and the page's
``st.fragment(run_every=...)`` draws :meth:`DecoderTrainer.view`. A run is bounded by
``core.limits`` (steps and wall-clock seconds).

    trainer = DecoderTrainer()
    setup = decoder_runs.build("reverse")       # the task's model, data and defaults
    trainer.start(setup, steps=400)
    trainer.view().metrics            # grows while it trains
    trainer.stop(); trainer.reset()
    params, version, trained = trainer.model(setup)   # the last trained model (or the untrained one)

Nothing here imports Streamlit: tests drive it as a plain object.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable

import numpy as np

from core import limits, warmup
from core.model import decoder
from core.model.tuned import decoder_loss
from core.training import decoder_runs
from core.training.decoder_runs import LM_TASK, Setup
from core.training.steps import DEFAULT_TRACK, check_track
from ui.background_run import BUSY, DONE, STOPPED, BackgroundRun
# Steps between two measurements of the validation metric during a run (about a tenth of a second
# each for the reverse task, a quarter for the language model; a step takes about 2 ms)
EVAL_EVERY = 100
TASKS = {"reverse": "encoder-decoder: reverse 8 digits",      # the page's labels of decoder_runs.DEFAULTS
         "sort": "encoder-decoder: sort 8 digits",
         LM_TASK: "decoder-only: character language model"}


# ----------------------------------------------------------------------------------------------
# what the page reads
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecoderView:
    """A copy of the trainer's record, safe to read while the worker carries on."""

    status: str
    message: str
    task: str
    step: int
    target_steps: int
    metrics: list            # one dict per step: step, loss, elapsed, ms_per_step (training alone)
    evals: list              # step, value: the validation metric where it was measured
    metric: str
    version: int             # grows whenever anything changes
    track: str               # the training step the run uses: readable or compiled

    @property
    def running(self) -> bool:
        return self.status in BUSY

    @property
    def last(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    @property
    def final_eval(self) -> float | None:
        return self.evals[-1]["value"] if self.evals else None


class DecoderTrainer(BackgroundRun):
    """Trains one decoder in a background thread; every method is thread-safe.

    ``max_steps`` and ``max_seconds`` cap a run (default ``core.limits``).
    """

    def __init__(self, *, max_steps: int = limits.MAX_TRAIN_STEPS, max_seconds: float = limits.MAX_TRAIN_SECONDS):
        self.max_steps = int(max_steps)
        self.max_seconds = float(max_seconds)
        super().__init__("decoder-trainer")
        self._setup: Setup | None = None
        self._params: dict | None = None       # the model the page shows: last trained, or untrained
        self._model_version = 0
        self._metrics: list = []
        self._evals: list = []
        self._target = 0
        self._track = DEFAULT_TRACK

    # -- control ---------------------------------------------------------------------------------
    def start(self, setup: Setup, steps: int | None = None, *, fit: Callable | None = None,
              track: str = DEFAULT_TRACK) -> None:
        """Train a fresh model of ``setup`` for ``steps`` (default: the task's; at most
        ``max_steps``) with ``track``'s training step (readable or compiled), once the server's
        training queue gives it a slot. ``fit`` trains it, called as
        :func:`core.training.decoder_runs.fit` (the default) is. Raises ``ValueError``; nothing
        changes then."""
        check_track(track)
        # while a freshly started server still compiles the compiled step: this run is readable, and says so
        compiled_missing = track == "compiled" and warmup.track(warmup.DECODER) == "readable"
        track = "readable" if compiled_missing else track
        steps = setup.defaults.steps if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= self.max_steps:
            raise ValueError(f"Steps must be a whole number between 1 and {self.max_steps}, got {steps!r}.")
        self._refuse_while_running("A run is already training: stop it first.")
        fit = decoder_runs.fit if fit is None else fit
        first = {"step": 0, "value": _val_acc(setup, _untrained(setup))}   # the weights every run starts from
        self._claim()

        def fresh():
            self._setup, self._target, self._track = setup, int(steps), track
            self._metrics, self._evals = [], [first]
        self._renew(fresh)
        self._launch(lambda generation: self._train(generation, setup, int(steps), fit, track, compiled_missing))

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step; the model trained so far is kept and shown."""
        self._halt(timeout)

    def reset(self, timeout: float = 30.0) -> None:
        """Stop, and forget the run and its model."""
        self._halt(timeout)

        def forget():
            self._setup, self._params = None, None
            self._metrics, self._evals, self._target = [], [], 0
            self._model_version += 1
        self._renew(forget)

    # -- reading -----------------------------------------------------------------------------------
    def view(self) -> DecoderView:
        """A consistent copy of everything the live view draws."""
        with self._lock:
            setup = self._setup
            return DecoderView(self._status, self._message, setup.task if setup else "",
                               self._metrics[-1]["step"] if self._metrics else 0, self._target,
                               list(self._metrics), list(self._evals), setup.metric if setup else "",
                               self._version, self._track)

    def model(self, setup: Setup) -> tuple[dict, int, bool]:
        """``(params, version, trained)`` of ``setup``'s task: the last model trained on it (kept
        while a new run trains), else fresh untrained weights (seed 0). ``version`` changes
        whenever the parameters do. Do not modify the arrays."""
        with self._lock:
            if self._params is not None and self._setup is not None and self._setup.task == setup.task:
                return self._params, self._model_version, True
        return _untrained(setup), -1, False

    # -- the worker ----------------------------------------------------------------------------------
    def _train(self, generation: int, setup: Setup, steps: int, fit: Callable, track: str,
               compiled_missing: bool = False) -> None:
        reason = ""
        eval_seconds = 0.0                    # measuring the validation metric is not training

        def after_step(step: int, loss: float) -> bool:
            nonlocal reason
            elapsed = time.perf_counter() - start
            with self._lock:
                if not self._mine(generation):
                    return True
                self._metrics.append({"step": step + 1, "loss": float(loss), "elapsed": elapsed,
                                      "ms_per_step": 1000.0 * (elapsed - eval_seconds) / (step + 1)})
                self._bump()
            if self._stop.is_set():
                reason = "stopped by you"
            elif elapsed >= self.max_seconds:
                reason = f"the time cap ({self.max_seconds:.0f} s) was reached"
            return bool(reason)

        def measure(step: int, params: dict) -> None:
            nonlocal eval_seconds
            t0 = time.perf_counter()
            value = _val_acc(setup, params)
            eval_seconds += time.perf_counter() - t0
            with self._lock:
                if self._mine(generation):
                    self._evals.append({"step": step, "value": value})
                    self._bump()

        if track == "compiled":               # loaded already (the warm-up), or compiled here (no warm-up)
            with self._compiling(generation, "the compiled training step"):
                decoder_loss.warm_up()
        self._set_status(generation, None, "This server has just started and still compiles the compiled step: "
                                           "this run trains on the readable step." if compiled_missing else "")
        start = time.perf_counter()           # the time cap counts training, not compiling
        params, _ = fit(setup, steps=steps, seed=0, callback=after_step, every=EVAL_EVERY, on_params=measure,
                        track=track)
        value = _val_acc(setup, params)
        with self._lock:
            if self._mine(generation):
                done = self._metrics[-1]["step"] if self._metrics else 0
                self._evals.append({"step": done, "value": value})
                self._params = params
                self._model_version += 1
                self._status = STOPPED if reason else DONE
                self._message = (f"Stopped at step {done} of {steps}: {reason}." if reason else
                                 f"Trained all {steps} steps.")
                self._bump()


def _val_acc(setup: Setup, params: dict) -> float:
    return decoder_runs.evaluate(setup, params)["val_acc"]


_UNTRAINED: dict = {}
_UNTRAINED_LOCK = threading.Lock()


def _untrained(setup: Setup) -> dict:
    """Seed-0 weights of ``setup``'s model, made once per process and shared by every session, so
    read-only: an edit in place raises instead of reaching another student's page."""
    with _UNTRAINED_LOCK:
        if setup.task not in _UNTRAINED:
            params = decoder.init_params(setup.cfg, seed=0)
            for array in params.values():
                array.flags.writeable = False
            _UNTRAINED[setup.task] = params
        return _UNTRAINED[setup.task]
