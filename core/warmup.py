"""Compile the heavy kernels once per server process, in a background thread, before a student asks.

On an empty Numba cache the practice pages' first visit used to wait for the training steps and
forward passes to compile (over a minute on two cores). The server's first session starts
:func:`start_once`; a thread then runs each heavy path once on tiny inputs, exactly as the pages
call them, so Numba compiles (or loads from its disk cache) the same machine code. The lesson
kernels come first: a lesson page needs them within seconds, and Numba compiles one function at a
time, so a lesson page opened while a training step compiles would otherwise wait for it.

    warm = start_once()                     # idempotent: one thread per process
    warm.progress()                         # (steps done, steps in all, what compiles now)
    warm.wait(timeout=1.0)

Nothing here imports Streamlit (``ui.warmup`` draws the progress on the pages).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

# the operations every lesson page warms (ui.widgets.ensure_kernels), union over the pages
LESSON_OPERATIONS = ("scaled_scores", "attention_with_weights", "project_heads", "merge_heads_project",
                     "weighted_sum", "sinusoidal")


def _lesson_kernels() -> None:
    from core import backend, validate
    from core.kernels import dispatch

    validate.warm_up("float64")
    dispatch.warm_up(backend.resolve(None), "float64", LESSON_OPERATIONS)


def _encoder() -> None:
    """Train a tiny default model two steps, walk it through and ablate a head, as "Train an
    encoder" and "Inside a trained model" do."""
    from core.lessons import inside
    from core.models import encoder

    model = inside.train_default("sum", 0, n_train=64, n_val=16, n_test=16, steps=2)
    X, y = model.data.X_test[:4], model.data.y_test[:4]
    inside.forward(model.params, model.cfg, X[:1])
    encoder.forward(model.params, X, model.cfg)
    inside.head_ablation(model.params, model.cfg, X, y)


def _decoder() -> None:
    """The decoder's training step, forward pass and generation (with and without the cache), in
    both precisions, for an encoder-decoder and a decoder-only model, as "Decoder and generation"
    and "Induction heads" run them."""
    from core.models import decoder, decoder_step
    from core.models.decoder_config import tiny_config

    decoder_step.warm_up()
    for cross in (True, False):
        cfg = tiny_config(cross)
        src = np.zeros(cfg.src_len, np.int64) if cross else None
        prompt = None if cross else np.zeros(1, np.int64)
        for dtype in (np.float32, np.float64):
            params = decoder.init_params(cfg, 0, dtype)
            decoder.forward(params, cfg, np.zeros((1, cfg.tgt_len), np.int64), None if src is None else src[None])
            for use_cache in (True, False):
                decoder.generate(params, cfg, src, prompt=prompt, max_new_tokens=2, use_cache=use_cache)


def _induction() -> None:
    from core.models import induction

    setup = induction.InductionSetup(steps=2, batch_size=2, n_held_out=2)
    run = induction.train_induction(setup)
    induction.measure(run.params, run.cfg, induction.held_out(setup))


LESSONS, ENCODER = "the lesson kernels", "the encoder's training step and forward pass"
DECODER, INDUCTION = "the decoder's training step, forward pass and generation", "the induction model"
STEPS = ((LESSONS, _lesson_kernels), (ENCODER, _encoder), (DECODER, _decoder), (INDUCTION, _induction))


class WarmUp:
    """Runs :data:`STEPS` once in a daemon thread; thread-safe to read."""

    def __init__(self, steps=STEPS):
        self._steps = tuple(steps)
        self._lock = threading.Lock()
        self._done = 0
        self._current = ""
        self._errors: list[str] = []
        self._finished = threading.Event()
        self.seconds: dict[str, float] = {}

    def start(self) -> "WarmUp":
        threading.Thread(target=self._run, name="kernel-warm-up", daemon=True).start()
        return self

    def _run(self) -> None:
        try:   # a lower priority for this thread alone (Linux): a student's page comes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        for label, fn in self._steps:
            with self._lock:
                self._current = label
            start = time.perf_counter()
            try:
                fn()
            except Exception as err:   # a page compiles it then, as before; nothing breaks here
                with self._lock:
                    self._errors.append(f"{label}: {type(err).__name__}: {err}")
            self.seconds[label] = time.perf_counter() - start
            with self._lock:
                self._done += 1
        with self._lock:
            self._current = ""
        self._finished.set()

    def progress(self) -> tuple[int, int, str]:
        """``(steps done, steps in all, the step running now or "")``."""
        with self._lock:
            return self._done, len(self._steps), self._current

    def has_done(self, label: str | None = None) -> bool:
        """Whether step ``label`` (and every step before it) has run; every step when None."""
        if label is None:
            return self.finished
        labels = [name for name, _ in self._steps]
        with self._lock:
            return label not in labels or self._done > labels.index(label)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)


_started: WarmUp | None = None
_start_lock = threading.Lock()


def start_once() -> WarmUp:
    """The process's warm-up, started on the first call (``ATTN_WARMUP=0`` turns it off: then a
    finished, empty one is returned and each page compiles what it needs, as before)."""
    global _started
    with _start_lock:
        if _started is None:
            if os.environ.get("ATTN_WARMUP", "1") == "0":
                _started = WarmUp(steps=())
                _started._finished.set()
            else:
                _started = WarmUp().start()
        return _started


def running() -> WarmUp | None:
    """The process's warm-up while it runs, else None (never starts one)."""
    warm = _started
    return warm if warm is not None and not warm.finished else None
