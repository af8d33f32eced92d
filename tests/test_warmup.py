"""The background warm-up: steps compile in a child process and load here, a page asks for a step
and it comes next, a page never waits for a compile (it runs the readable track meanwhile and says
so), a timing runs with the compiling child stopped, and the process starts one warm-up at most."""
import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from numba import njit
from streamlit.testing.v1 import AppTest

from core import readiness, warmup

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.compile
def test_every_step_compiles_in_a_child_and_loads_here_without_error():
    """The real steps, each in its child process (compiled already, or from the disk cache): an
    error here would leave a page on the readable track for good."""
    warm = warmup.WarmUp(warmup.STEPS, warmup.ON_DEMAND)
    for label in warmup.SPEED_FOR.values():
        warm.want(label)
    warm.start()
    assert warm.wait(900) and warm.errors == []
    labels = {label for label, _, _ in (*warmup.STEPS, *warmup.ON_DEMAND)}
    assert warm.progress() == (len(labels), len(labels), "") and set(warm.seconds) == labels


def test_a_wanted_step_comes_next_and_a_failing_step_does_not_stop_the_rest():
    gate, ran = threading.Event(), []

    def blocked():
        gate.wait(10)
        ran.append("a")

    def broken():
        raise RuntimeError("no compiler today")

    steps = [("a", blocked), ("b", broken), ("c", lambda: ran.append("c"))]
    warm = warmup.WarmUp(steps, on_demand=[("d", lambda: ran.append("d")), ("e", lambda: ran.append("e"))]).start()
    time.sleep(0.1)
    assert warm.progress() == (0, 3, "a") and not warm.has_done("a") and not warm.finished
    warm.want("d")                                           # asked for by a page: next, and counted
    warm.want("c")                                           # ... and this one before it
    assert warm.progress() == (0, 4, "a")
    gate.set()
    assert warm.wait(10)
    assert ran == ["a", "c", "d"] and warm.has_done("d") and warm.progress() == (4, 4, "")
    assert warm.errors == ["b: RuntimeError: no compiler today"]
    warm.want("d")                                           # done: nothing runs again
    assert warm.finished and ran == ["a", "c", "d"]
    warm.want("e")                                           # asked for after the end: the warm-up runs again
    assert warm.wait(10) and ran == ["a", "c", "d", "e"] and warm.progress() == (5, 5, "")


def test_a_step_loads_here_between_page_runs_or_after_waiting_its_longest(monkeypatch):
    """Loading (or compiling) here holds the interpreter's lock, which a running page needs: a step
    waits for the pages running to end, at most ``PAGE_WAIT_S``; a page waiting for a step does not
    count as running."""
    ran = []
    warm = warmup.WarmUp(steps=(), on_demand=[("a", lambda: ran.append(("a", time.monotonic()))),
                                              ("b", lambda: ran.append(("b", time.monotonic())))])
    with warm.page_running():
        warm.want("a")
        time.sleep(0.5)
        assert ran == [] and not warm.has_done("a")          # held back while the page runs
        ended = time.monotonic()
    assert warm.wait(10) and ran[0][0] == "a" and ran[0][1] >= ended
    monkeypatch.setattr(warmup, "PAGE_WAIT_S", 0.3)
    with warm.page_running():                               # a page that runs on: the step goes ahead
        started = time.monotonic()
        warm.want("b")
        assert warm.wait(10) and ran[1][1] - started >= 0.3
    ran.clear()
    warm = warmup.WarmUp(steps=(), on_demand=[("c", lambda: ran.append("c"))])
    monkeypatch.setattr(warmup, "PAGE_WAIT_S", 30)
    with warm.page_running(), warm.page_waiting():          # Make it fast waits for its kernels
        warm.want("c")
        assert warm.wait(10) and ran == ["c"]


def test_a_warm_up_started_after_a_page_waits_for_the_first_page_or_its_longest(monkeypatch):
    """The router starts the warm-up as a fresh server's first visit begins, before its page runs:
    no step (and no compiling child) starts until a page has run here, at most ``PAGE_WAIT_S``."""
    ran = []
    monkeypatch.setattr(warmup, "PAGE_WAIT_S", 30)          # the page's end, not the wait's cap, starts it
    warm = warmup.WarmUp(steps=[("a", lambda: ran.append(time.monotonic()))]).start(after_a_page=True)
    time.sleep(0.3)
    assert ran == [] and warm.progress() == (0, 1, "")       # the page has not begun yet
    with warm.page_running():
        time.sleep(0.3)
        assert ran == []
        ended = time.monotonic()
    assert warm.wait(10) and ran[0] >= ended
    monkeypatch.setattr(warmup, "PAGE_WAIT_S", 0.3)
    started = time.monotonic()
    warm = warmup.WarmUp(steps=[("b", lambda: ran.append(time.monotonic()))]).start(after_a_page=True)
    assert warm.wait(10) and ran[1] - started >= 0.3         # no page came: it went ahead


def test_the_router_runs_each_page_as_a_page_running(monkeypatch):
    seen = []

    class Recording(warmup.WarmUp):
        @contextlib.contextmanager
        def page_running(self):
            with super().page_running():
                seen.append(self._pages)
                yield

    warm = Recording(steps=())
    monkeypatch.setattr(readiness, "_started", warm)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    assert not at.exception and seen == [1] and warm._pages == 0


def test_one_warm_up_per_process_and_it_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(readiness, "_started", None)
    monkeypatch.setenv("ATTN_WARMUP", "0")
    off = warmup.start_once()
    assert off.finished and warmup.start_once() is off and warmup.running() is None
    assert warmup.ready(warmup.ENCODER) and warmup.track(warmup.ENCODER) == "compiled"


def test_the_warm_up_started_is_the_one_the_layers_below_read(monkeypatch):
    """start_once registers its warm-up in core.readiness: the readable sublayers (core.model.layers)
    ask there whether a compiled loop is loaded."""
    from core.model import layers

    monkeypatch.setattr(readiness, "_started", None)
    monkeypatch.setenv("ATTN_WARMUP", "0")
    assert readiness.started() is None
    warm = warmup.start_once()
    assert readiness.started() is warm and layers.can_run is readiness.can_run


def test_a_page_trains_on_the_readable_step_until_the_compiled_one_has_loaded(monkeypatch):
    gate = threading.Event()
    warm = warmup.WarmUp(steps=[(warmup.ENCODER, lambda: gate.wait(20))]).start()
    monkeypatch.setattr(readiness, "_started", warm)
    try:
        assert not warmup.ready(warmup.ENCODER) and warmup.track(warmup.ENCODER) == "readable"
    finally:
        gate.set()
    assert warm.wait(10) and warmup.track(warmup.ENCODER) == "compiled"


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]


def test_paused_stops_the_compiling_child_and_continues_it(monkeypatch):
    class Sleeper:                                           # a child that compiles nothing, slowly
        def __init__(self):
            self.proc = subprocess.Popen(["sleep", "30"])

        def compile(self, index):
            return ""

    monkeypatch.setattr(warmup, "_Compiler", Sleeper)
    warm = warmup.WarmUp(steps=())
    warm._child_compiles(0)
    child = warm._compiler.proc
    try:
        with warm.paused():
            time.sleep(0.2)
            assert _state(child.pid) == "T"                  # stopped while a page times
        time.sleep(0.2)
        assert _state(child.pid) in "RS"
        with warm.paused():                                  # a child started during a pause starts stopped
            child.kill()
            child.wait()
            warm._child_compiles(1)
            other = warm._compiler.proc
            time.sleep(0.2)
            assert other is not child and _state(other.pid) == "T"
        other.send_signal(signal.SIGKILL)
    finally:
        child.kill()


SPAWN_BESIDE_PRODUCTS = r"""
import sys, threading
import numpy as np
from core import warmup
def products():                          # a page's NumPy products, on OpenBLAS's threads
    mats = [np.random.default_rng(0).normal(size=(n, n)) for n in (16, 48, 64, 100, 200)]
    while True:
        for a in mats:
            a @ a
threading.Thread(target=products, daemon=True).start()
for _ in range(int(sys.argv[1])):
    child = warmup._Compiler()
    child.proc.kill()
    child.proc.wait()
print("started them all", flush=True)
"""


def test_the_compiling_child_starts_while_a_page_multiplies_and_runs_niced():
    """Starting the child must not fork with the interpreter's lock held: OpenBLAS's fork handler
    joins its threads, and a page's product running on them waits for that lock, forever (a cold
    server hung so, about one start in three). The child lowers its own priority instead."""
    try:
        out = subprocess.run([sys.executable, "-c", SPAWN_BESIDE_PRODUCTS, "2000"], cwd=ROOT, capture_output=True,
                             text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("still waiting after 240 s on 2,000 compiling children started beside NumPy products: "
                    "a fork deadlocked")
    assert out.stdout.strip() == "started them all", out.stderr[-2000:]

    child = warmup._Compiler()
    try:
        assert child.compile(len(warmup.STEPS) + len(warmup.ON_DEMAND)) != ""    # no such step: it answers
        nice = int(Path(f"/proc/{child.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice == warmup.CHILD_NICE
    finally:
        child.close()


def test_the_kernels_make_it_fast_asks_for_are_its_operations():
    from core.lessons import speed

    assert set(warmup.SPEED_FOR) == set(speed.OPERATIONS)


def test_inside_a_trained_model_draws_on_the_readable_track_while_the_compiled_step_is_missing(monkeypatch):
    """Opened while the server still compiles the encoder's step: the page does not wait for it; it
    trains the default model on the readable step and says so where it names the model."""
    gate = threading.Event()
    warm = warmup.WarmUp(steps=[(warmup.ENCODER, lambda: gate.wait(60))]).start()
    monkeypatch.setattr(readiness, "_started", warm)
    from core.model.tuned import classifier

    def no_compiled_step(*args, **kwargs):
        raise AssertionError("the compiled step ran before it was ready")

    monkeypatch.setattr(classifier, "train_step", no_compiled_step)
    monkeypatch.setattr(classifier, "predict_flat", no_compiled_step)
    try:
        at = AppTest.from_file(str(ROOT / "views" / "inside_model.py"), default_timeout=120)
        at.session_state["inside_model.data_sizes"] = (160, 40, 40)
        at.session_state["inside_model.steps"] = 6
        at.session_state["inside_model.seed"] = 917                   # a model no other test has cached
        at.run()
        assert not at.exception and not warm.has_done(warmup.ENCODER)
        caption = next(c.value for c in at.caption if c.value.startswith("Using the default model"))
        assert "trained on the readable training step" in caption
    finally:
        gate.set()
    assert warm.wait(10)
    monkeypatch.undo()
    at.session_state["inside_model.seed"] = 918                       # once compiled: the compiled step
    at.run()
    caption = next(c.value for c in at.caption if c.value.startswith("Using the default model"))
    assert "trained on the compiled training step" in caption
