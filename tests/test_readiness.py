"""Whether compiled code may run now (core.readiness): true everywhere while no warm-up runs in the
process; while one runs, a step once it has loaded and a Numba function once its machine code for
the argument types has."""
import threading

from numba import njit

from core import readiness, warmup


@njit(cache=False)
def _never_called_before(x):
    return x + 1


def test_with_no_warm_up_everything_may_run(monkeypatch):
    monkeypatch.setattr(readiness, "_started", None)
    assert readiness.running() is None and readiness.ready(warmup.ENCODER)
    assert readiness.can_run(_never_called_before, 1j)          # compiles on first use, as in a script


def test_while_the_warm_up_runs_only_what_has_loaded_may_run(monkeypatch):
    gate = threading.Event()
    warm = warmup.WarmUp(steps=[(warmup.ENCODER, lambda: gate.wait(20))]).start()
    monkeypatch.setattr(readiness, "_started", None)
    readiness.register(warm)
    try:
        assert readiness.running() is warm and readiness.started() is warm
        assert not readiness.ready(warmup.ENCODER) and readiness.ready("a step this warm-up does not have")
        assert not readiness.can_run(_never_called_before, 1.0)
        _never_called_before(1.0)                                # compiled now: float64 loaded, int64 not
        assert readiness.can_run(_never_called_before, 2.0) and not readiness.can_run(_never_called_before, 2)
    finally:
        gate.set()
    assert warm.wait(10)
    assert readiness.running() is None and readiness.started() is warm
    assert readiness.ready(warmup.ENCODER) and readiness.can_run(_never_called_before, 2)
