"""The training loop every model shares (the encoder, the decoders, the induction model): for each
step, the next batch, one update at that step's learning rate, and the time it took.

    for s in steps(update, next_batch, stop=300, rate=schedule):
        ...  # s.step, s.loss (what update returned), s.seconds, s.cpu_seconds

``update(batch, lr)`` does one step's work: the gradient and Adam (:func:`gradient_update`), or the
encoder's compiled step that does both in one call. A caller stops early by leaving the loop.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, NamedTuple


class Step(NamedTuple):
    step: int                 # counts from 0
    loss: object              # what ``update`` returned
    seconds: float            # wall time of the update
    cpu_seconds: float        # CPU time of this thread (unaffected by other busy processes)


def steps(update: Callable, next_batch: Callable, *, stop: int, start: int = 0,
          rate: Callable | None = None) -> Iterator[Step]:
    """Steps ``start .. stop-1``: ``update(next_batch(step), rate(step))`` (``rate`` None: ``lr`` None,
    the optimiser's own rate), timed."""
    for step in range(start, stop):
        batch = next_batch(step)
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = update(batch, None if rate is None else rate(step))
        yield Step(step, loss, time.perf_counter() - t0, time.thread_time() - c0)


def gradient_update(gradient: Callable, flat, grads, optimizer) -> Callable:
    """An ``update`` for :func:`steps`: ``loss = gradient(*batch, grads)`` (the loss, and its
    gradient into ``grads``), then Adam on ``flat`` at the step's rate; returns the loss."""
    def update(batch, lr):
        loss = gradient(*batch, grads)
        optimizer.step(flat, grads, lr)
        return loss
    return update
