"""The background warm-up: each heavy path runs once without error, progress is reported, a page
waits for the step it needs (with a progress bar), and the process starts one warm-up at most."""
import threading
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from core import warmup

ROOT = Path(__file__).resolve().parents[1]


def test_every_step_runs_the_pages_paths_without_error():
    """The real steps (compiled already or from the disk cache): an error here would leave a
    page to compile on its own, silently."""
    warm = warmup.WarmUp()
    warm._run()
    assert warm.errors == [] and warm.finished
    assert warm.progress() == (len(warmup.STEPS), len(warmup.STEPS), "")
    assert set(warm.seconds) == {label for label, _ in warmup.STEPS}


def test_progress_and_has_done_follow_the_steps_and_a_failing_step_does_not_stop_the_rest():
    gate, ran = threading.Event(), []

    def blocked():
        gate.wait(10)
        ran.append("a")

    def broken():
        raise RuntimeError("no compiler today")

    warm = warmup.WarmUp(steps=[("a", blocked), ("b", broken), ("c", lambda: ran.append("c"))]).start()
    time.sleep(0.1)
    assert warm.progress() == (0, 3, "a") and not warm.has_done("a") and not warm.has_done() and not warm.finished
    gate.set()
    assert warm.wait(10)
    assert ran == ["a", "c"] and warm.has_done("c") and warm.has_done() and warm.progress() == (3, 3, "")
    assert warm.errors == ["b: RuntimeError: no compiler today"]


def test_one_warm_up_per_process_and_it_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(warmup, "_started", None)
    monkeypatch.setenv("ATTN_WARMUP", "0")
    off = warmup.start_once()
    assert off.finished and warmup.start_once() is off and warmup.running() is None


def test_a_page_waits_for_its_step_then_draws(monkeypatch):
    """The induction page opened while the warm-up compiles: it waits (behind a progress bar) for
    the induction step, and draws once that step has run."""
    gate = threading.Event()
    warm = warmup.WarmUp(steps=[(warmup.INDUCTION, lambda: gate.wait(20))]).start()
    monkeypatch.setattr(warmup, "_started", warm)
    threading.Timer(1.5, gate.set).start()
    started = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "views" / "induction.py"), default_timeout=120)
    at.session_state["induction.steps"] = 20
    at.run()
    assert not at.exception
    assert time.perf_counter() - started >= 1.4 and warm.finished
    assert at.metric                                   # the page drew its numbers after waiting
