"""A training run in a background thread, with a thread-safe record the page reads: what the two
training pages' workers (:mod:`ui.trainer`, :mod:`ui.decoder_trainer`) have in common.

Streamlit runs the page script on every click; a training run takes seconds to a minute. So the
page keeps one run object in ``st.session_state`` (one per session: sessions never share a
record); a command hands the work to a thread, and the page's ``st.fragment(run_every=...)``
reads the record a few times a second and redraws. The thread never calls Streamlit: it only
writes behind a lock.

A subclass keeps its own record and describes the work; this class owns the rest:

- the server's training slots: at most ``MAX_CONCURRENT_RUNS`` workers train at once in the whole
  process, whatever their model, so a class sharing one or two cores stays responsive;
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

import threading
from typing import Callable

MAX_CONCURRENT_RUNS = 3       # worker threads training at once, over all sessions of the server

IDLE, RUNNING, PAUSED, STOPPED, DONE, LOADED, ERROR = (
    "idle", "running", "paused", "stopped", "done", "loaded", "error")

_slots = threading.BoundedSemaphore(MAX_CONCURRENT_RUNS)


class TrainerBusy(ValueError):
    """Every training slot of the server is taken; try again in a moment."""


def take_slot() -> None:
    """Claim one of the server's training slots (raise :class:`TrainerBusy` when none is free)."""
    if not _slots.acquire(blocking=False):
        raise TrainerBusy(f"{MAX_CONCURRENT_RUNS} runs are already training on this server; "
                          "try again in a minute.")


def release_slot() -> None:
    _slots.release()


class BackgroundRun:
    """One worker thread at a time and the status it reports; every public method is thread-safe.

    ``name`` names the thread (it shows in a debugger).
    """

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
        return self.status == RUNNING

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to end; True when no worker is left."""
        return self._join(timeout)

    # -- for subclasses ----------------------------------------------------------------------------
    def _refuse_while_running(self, message: str) -> None:
        with self._lock:
            if self._status == RUNNING:
                raise ValueError(message)

    def _claim(self) -> None:
        """Wait for an ended worker, then take a slot: call it before changing the record, so a busy
        server (:class:`TrainerBusy`) leaves the old record alone."""
        self._join()
        take_slot()

    def _launch(self, work: Callable[[int], None]) -> None:
        """Run ``work(generation)`` in a new thread, with the status ``running``. The caller holds a
        slot (:meth:`_claim`); the worker gives it back when it ends."""
        with self._lock:
            self._stop.clear()
            self._status, self._message = RUNNING, ""
            self._bump()
            generation = self._generation
        self._thread = threading.Thread(target=self._work, args=(work, generation), name=self._name, daemon=True)
        try:
            self._thread.start()
        except BaseException:
            release_slot()
            raise

    def _work(self, work: Callable[[int], None], generation: int) -> None:
        try:
            work(generation)
        except Exception as err:   # the page shows the message; the thread must end cleanly
            self._set_status(generation, ERROR, f"Training stopped: {err}")
        finally:
            release_slot()

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
