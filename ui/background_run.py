"""A training run in a background thread, with a thread-safe record the page reads: what the two
training pages' workers (:mod:`ui.trainer`, :mod:`ui.decoder_trainer`) have in common.

Streamlit runs the page script on every click; a training run takes seconds to a minute. So the
page keeps one run object in ``st.session_state`` (one per session: sessions never share a
record); a command hands the work to a thread, and the page's ``st.fragment(run_every=...)``
reads the record a few times a second and redraws. The thread never calls Streamlit: it only
writes behind a lock.

A subclass keeps its own record and describes the work; this class owns the rest:

- the server's training queue: at most ``MAX_CONCURRENT_RUNS`` workers train at once in the whole
  process (one per core), whatever their model; the others wait their turn, first come first
  served, with the status ``queued`` and their place in the message. Waiting is not training: a
  run's time cap counts from its first step;
- the worker's lifecycle: :meth:`_launch` starts ``work(generation)`` in a thread; an exception in
  it becomes the status ``error`` with its message (never a traceback), and the slot is given back
  however the work ends;
- the generation: bumped by every command that replaces the record (a new start, a reset), so a
  stale worker's late writes are ignored (:meth:`_mine`);
- the stop request, the status, the message and the version the page polls.

The work itself is a callable, so what a step does (which training loop, which step inside it) is
the caller's choice, not this class's. Nothing here imports Streamlit: tests drive it as a plain object.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
from typing import Callable

from core import limits

# worker threads training at once, over all sessions of the server: one per core, so that a run
# trains at about the speed it would alone (its own metrics say so: ms per step)
MAX_CONCURRENT_RUNS = max(1, os.cpu_count() or 1)

IDLE, QUEUED, COMPILING, RUNNING, PAUSED, STOPPED, DONE, LOADED, ERROR = (
    "idle", "queued", "compiling", "running", "paused", "stopped", "done", "loaded", "error")
BUSY = (QUEUED, COMPILING, RUNNING)     # a worker holds, or waits for, a training slot


class TrainingQueue:
    """The server's training slots, handed out first come, first served."""

    def __init__(self, slots: int):
        self.slots = slots
        self._cond = threading.Condition()
        self._training = 0
        self._waiting: collections.deque = collections.deque()

    def wait_turn(self, stop: threading.Event, on_place: Callable[[int, int], None], poll_s: float = 0.25) -> bool:
        """Wait for a slot (True), or until ``stop`` is set (False: the run left the queue).
        ``on_place(place, training)`` is called whenever the place (1 = next) changes."""
        ticket, told = object(), None
        with self._cond:
            self._waiting.append(ticket)
            try:
                while not (self._waiting[0] is ticket and self._training < self.slots):
                    if stop.is_set():
                        return False
                    place = self._waiting.index(ticket) + 1
                    if place != told:
                        on_place(place, self._training)
                        told = place
                    self._cond.wait(poll_s)
                self._training += 1
                return True
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._training -= 1
            self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """``(runs training, runs waiting)``."""
        with self._cond:
            return self._training, len(self._waiting)


QUEUE = TrainingQueue(MAX_CONCURRENT_RUNS)


def queue_message(place: int, training: int, slots: int, cap_s: float) -> str:
    """What a queued run tells its student: its place, who is training, and the longest wait (each
    run ahead trains for at most ``cap_s`` seconds, ``slots`` at once)."""
    longest = math.ceil(place / slots) * cap_s
    return (f"waiting for a training slot: place {place} in the queue ({training} runs are training on this "
            f"server, {slots} at most at once: one per core); at most about {longest:.0f} s, since each run "
            f"trains for at most {cap_s:.0f} s")


class BackgroundRun:
    """One worker thread at a time and the status it reports; every public method is thread-safe.

    ``name`` names the thread (it shows in a debugger). ``max_seconds`` caps one run's training time
    (a subclass sets it; the queue's estimate of a wait reads it).
    """

    max_seconds: float = limits.MAX_TRAIN_SECONDS

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status, self._message = IDLE, ""
        self._version = 0             # grows whenever anything in the record changes
        self._generation = 0          # bumped by whatever replaces the record: a stale worker's writes are ignored

    # -- reading -----------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        with self._lock:
            return self._status

    @property
    def running(self) -> bool:
        """Training, compiling to train, or queued to train."""
        return self.status in BUSY

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to end; True when no worker is left."""
        return self._join(timeout)

    # -- for subclasses ----------------------------------------------------------------------------
    def _refuse_while_running(self, message: str) -> None:
        with self._lock:
            if self._status in BUSY:
                raise ValueError(message)

    def _claim(self) -> None:
        """Wait for an ended worker: call it before changing the record."""
        self._join()

    # the status a run stopped while it waited for its turn ends in (the encoder's trainer: paused)
    _left_queue_status = STOPPED

    def _launch(self, work: Callable[[int], None]) -> None:
        """Run ``work(generation)`` in a new thread once the server's queue gives it a slot (status
        ``queued`` until then, with its place; ``running`` after); the slot is given back when it ends."""
        with self._lock:
            self._stop.clear()
            self._status, self._message = QUEUED, ""
            self._bump()
            generation = self._generation
        self._thread = threading.Thread(target=self._work, args=(work, generation), name=self._name, daemon=True)
        self._thread.start()

    def _work(self, work: Callable[[int], None], generation: int) -> None:
        def tell(place: int, training: int) -> None:
            self._set_status(generation, QUEUED, queue_message(place, training, QUEUE.slots, self.max_seconds))
        if not QUEUE.wait_turn(self._stop, tell):
            self._set_status(generation, self._left_queue_status, "Stopped while it waited for a training slot.")
            return
        try:
            self._set_status(generation, RUNNING, "")
            work(generation)
        except Exception as err:   # the page shows the message; the thread must end cleanly
            self._set_status(generation, ERROR, f"Training stopped: {err}")
        finally:
            QUEUE.release()

    @contextlib.contextmanager
    def _compiling(self, generation: int, what: str):
        """Status ``compiling`` (with ``what`` and why it takes a while) for the ``with`` block, then
        ``running`` again: a run whose first step waits on Numba says so instead of standing at step 0."""
        self._set_status(generation, COMPILING,
                         f"preparing {what}: loaded from the disk cache in a moment, or compiled on its first use "
                         f"on this server (a minute or two on two cores, longer when they are busy)")
        try:
            yield
        finally:
            self._set_status(generation, RUNNING, "")

    def _halt(self, timeout: float) -> None:
        """Ask the worker to stop after its current step, and wait for it (at most ``timeout`` s)."""
        self._stop.set()
        self._join(timeout)

    def _renew(self, clear: Callable[[], None] | None = None, status: str = IDLE, message: str = "") -> None:
        """Start a new record: a new generation (a worker still running no longer writes), ``clear()``
        under the lock, then ``status`` and ``message``."""
        with self._lock:
            self._generation += 1
            if clear is not None:
                clear()
            self._status, self._message = status, message
            self._bump()

    def _mine(self, generation: int) -> bool:
        """Whether ``generation`` still owns the record (else a reset or a new start does)."""
        return self._generation == generation

    def _set_status(self, generation: int, status: str | None = None, message: str = "") -> None:
        """Set the status (None: keep it) and message, if ``generation`` still owns the record."""
        with self._lock:
            if self._mine(generation):
                if status is not None:
                    self._status = status
                self._message = message
                self._bump()

    def _join(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
        return True

    def _bump(self) -> None:
        self._version += 1
