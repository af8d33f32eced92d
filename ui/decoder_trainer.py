"""Training a decoder in the background, for the page "Decoder and generation".

The same pattern as :mod:`ui.trainer`, whose server-wide training slots it shares: the page keeps
one :class:`DecoderTrainer` in ``st.session_state``; ``start()`` hands the run to a thread, which
only appends to lists behind a lock, and the page's ``st.fragment(run_every=...)`` draws
:meth:`DecoderTrainer.view`. A run is bounded by ``core.limits`` (steps and wall-clock seconds).

    trainer = DecoderTrainer()
    trainer.start("reverse", steps=400)
    trainer.view().metrics            # grows while it trains
    trainer.stop(); trainer.reset()
    setup, params, version = trainer.model()   # the last trained model (or the untrained one)

Nothing here imports Streamlit: tests drive it as a plain object.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from core import limits
from core.models import decoder, tasks
from core.models.decoder import DecoderConfig
from ui.trainer import DONE, ERROR, IDLE, RUNNING, release_slot, take_slot

STOPPED = "stopped"
TASKS = {"reverse": "encoder-decoder: reverse 8 digits",
         "sort": "encoder-decoder: sort 8 digits",
         "chars": "decoder-only: character language model"}
EVAL_EVERY = 50          # steps between two evaluations of the validation metric


# ----------------------------------------------------------------------------------------------
# what a run trains: model, data and optimiser settings, in one place
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setup:
    """A task's model configuration, its data and its default optimiser settings."""

    task: str
    cfg: DecoderConfig
    data: object                  # tasks.SequenceDataset or tasks.CharCorpus
    steps: int                    # default number of steps
    batch_size: int
    lr: float
    warmup: int
    metric: str                   # what the accuracy curve measures

    @property
    def seq2seq(self) -> bool:
        return self.task in tasks.SEQUENCE_TASKS

    def train_arrays(self):
        """``(tgt_in, tgt_out, src)`` of the training split (``src`` None for the language model)."""
        d = self.data
        if self.seq2seq:
            return d.tgt_in_train, d.tgt_out_train, d.src_train
        return d.X_train, d.Y_train, None

    def val_arrays(self):
        """``(tgt_in, tgt_out, src)`` of the validation split."""
        d = self.data
        if self.seq2seq:
            return d.tgt_in_val, d.tgt_out_val, d.src_val
        return d.X_val, d.Y_val, None

    def evaluate(self, params: dict, limit: int = 500) -> float:
        """Sequence tasks: greedy exact match on (up to ``limit``) validation examples; the language
        model: share of validation characters predicted right (argmax, teacher forcing)."""
        tgt_in, tgt_out, src = (a if a is None else a[:limit] for a in self.val_arrays())
        if self.seq2seq:
            return decoder.greedy_exact_match(params, self.cfg, src, tgt_out)
        logits, _ = decoder.forward(params, self.cfg, tgt_in)
        return float((logits.argmax(axis=-1) == tgt_out).mean())


def build(task: str) -> Setup:
    """The model, data and defaults of ``task`` ("reverse", "sort" or "chars")."""
    if task in tasks.SEQUENCE_TASKS:
        ds = tasks.make_sequence_dataset(task, n_train=4000, n_val=500, seq_len=8, seed=0)
        cfg = DecoderConfig(ds.vocab_size, ds.seq_len, src_vocab_size=ds.src_vocab_size, src_len=ds.seq_len,
                            bos_id=ds.bos_id)
        steps = 400 if task == "reverse" else 800
        return Setup(task, cfg, ds, steps, batch_size=64, lr=3e-3, warmup=50, metric="exact match (greedy)")
    if task == "chars":
        corpus = tasks.make_char_corpus(context=32)
        cfg = DecoderConfig(corpus.vocab.size, corpus.context, cross_attention=False)
        return Setup(task, cfg, corpus, 400, batch_size=32, lr=3e-3, warmup=50, metric="next-character accuracy")
    raise ValueError(f"Unknown task {task!r}: choose one of {', '.join(TASKS)}.")


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
    metrics: list            # one dict per step: step, loss, elapsed
    evals: list              # step, value: the validation metric where it was measured
    metric: str
    version: int             # grows whenever anything changes

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    @property
    def last(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    @property
    def final_eval(self) -> float | None:
        return self.evals[-1]["value"] if self.evals else None


class DecoderTrainer:
    """Trains one decoder in a background thread; every method is thread-safe.

    ``max_steps`` and ``max_seconds`` cap a run (default ``core.limits``).
    """

    def __init__(self, *, max_steps: int = limits.MAX_TRAIN_STEPS, max_seconds: float = limits.MAX_TRAIN_SECONDS):
        self.max_steps = int(max_steps)
        self.max_seconds = float(max_seconds)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._setup: Setup | None = None
        self._params: dict | None = None       # the model the page shows: last trained, or untrained
        self._model_version = 0
        self._status, self._message = IDLE, ""
        self._metrics: list = []
        self._evals: list = []
        self._target = 0
        self._version = 0
        self._generation = 0                   # bumped by start/reset: a stale worker's writes are ignored

    # -- control ---------------------------------------------------------------------------------
    def start(self, setup: Setup, steps: int | None = None) -> None:
        """Train a fresh model of ``setup`` for ``steps`` (default ``setup.steps``; at most
        ``max_steps``). Raises ``ValueError`` (or ``ui.trainer.TrainerBusy``); nothing changes then."""
        steps = setup.steps if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= self.max_steps:
            raise ValueError(f"Steps must be a whole number between 1 and {self.max_steps}, got {steps!r}.")
        with self._lock:
            if self._status == RUNNING:
                raise ValueError("A run is already training: stop it first.")
        first = {"step": 0, "value": setup.evaluate(_untrained(setup))}   # the weights every run starts from
        self._join()
        take_slot()        # before anything changes: a busy server leaves the old record alone
        with self._lock:
            self._generation += 1
            self._setup, self._target = setup, int(steps)
            self._metrics, self._evals = [], [first]
            self._status, self._message = RUNNING, ""
            self._stop.clear()
            self._bump()
        self._thread = threading.Thread(target=self._work, args=(self._generation, setup, int(steps)),
                                        name="decoder-trainer", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            release_slot()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current step; the model trained so far is kept and shown."""
        self._stop.set()
        self._join(timeout)

    def reset(self, timeout: float = 30.0) -> None:
        """Stop, and forget the run and its model."""
        self._stop.set()
        self._join(timeout)
        with self._lock:
            self._generation += 1
            self._setup, self._params = None, None
            self._metrics, self._evals, self._target = [], [], 0
            self._status, self._message = IDLE, ""
            self._model_version += 1
            self._bump()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to end; True when no worker is left."""
        return self._join(timeout)

    # -- reading -----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        with self._lock:
            return self._status == RUNNING

    def view(self) -> DecoderView:
        """A consistent copy of everything the live view draws."""
        with self._lock:
            setup = self._setup
            return DecoderView(self._status, self._message, setup.task if setup else "",
                               self._metrics[-1]["step"] if self._metrics else 0, self._target,
                               list(self._metrics), list(self._evals), setup.metric if setup else "",
                               self._version)

    def model(self, setup: Setup) -> tuple[dict, int, bool]:
        """``(params, version, trained)`` of ``setup``'s task: the last model trained on it (kept
        while a new run trains), else fresh untrained weights (seed 0). ``version`` changes
        whenever the parameters do. Do not modify the arrays."""
        with self._lock:
            if self._params is not None and self._setup is not None and self._setup.task == setup.task:
                return self._params, self._model_version, True
        return _untrained(setup), -1, False

    # -- the worker ----------------------------------------------------------------------------------
    def _join(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
        return True

    def _work(self, generation: int, setup: Setup, steps: int) -> None:
        def mine() -> bool:
            return self._generation == generation      # else a reset or a new start owns the record

        start = time.perf_counter()
        reason = ""

        def after_step(step: int, loss: float) -> bool:
            nonlocal reason
            elapsed = time.perf_counter() - start
            with self._lock:
                if not mine():
                    return True
                self._metrics.append({"step": step + 1, "loss": float(loss), "elapsed": elapsed})
                self._bump()
            if self._stop.is_set():
                reason = "stopped by you"
            elif elapsed >= self.max_seconds:
                reason = f"the time cap ({self.max_seconds:.0f} s) was reached"
            return bool(reason)

        try:
            params = decoder.init_params(setup.cfg, seed=0)
            tgt_in, tgt_out, src = setup.train_arrays()
            decoder.train(params, setup.cfg, tgt_in, tgt_out, src, steps=steps, batch_size=setup.batch_size,
                          lr=setup.lr, warmup=setup.warmup, seed=0, callback=after_step)
            value = setup.evaluate(params)
            with self._lock:
                if mine():
                    done = self._metrics[-1]["step"] if self._metrics else 0
                    self._evals.append({"step": done, "value": value})
                    self._params = params
                    self._model_version += 1
                    self._status = STOPPED if reason else DONE
                    self._message = (f"Stopped at step {done} of {steps}: {reason}." if reason else
                                     f"Trained all {steps} steps.")
                    self._bump()
        except Exception as err:   # the page shows the message; the thread must end cleanly
            with self._lock:
                if mine():
                    self._status, self._message = ERROR, f"Training stopped: {err}"
                    self._bump()
        finally:
            release_slot()

    def _bump(self) -> None:
        self._version += 1


_UNTRAINED: dict = {}
_UNTRAINED_LOCK = threading.Lock()


def _untrained(setup: Setup) -> dict:
    """Seed-0 weights of ``setup``'s model, made once per process (read-only)."""
    with _UNTRAINED_LOCK:
        if setup.task not in _UNTRAINED:
            _UNTRAINED[setup.task] = decoder.init_params(setup.cfg, seed=0)
        return _UNTRAINED[setup.task]
