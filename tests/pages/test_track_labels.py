"""A page names the training step that ran, not the one chosen.

On a freshly started server the compiled training steps are still compiling in the background
(``core.warmup``); until one has loaded, a run asked for on the compiled step trains on the readable
one. The page must then say "readable" wherever it names the step behind its numbers: the
ms-per-step metric, its captions, and the source expander's list of functions. Once the compiled
step has loaded, a run on it says "compiled".

The warm-up here is a real :class:`core.warmup.WarmUp` with do-nothing steps: one that has started
and loaded nothing yet ("still compiling"), or one that has loaded the training steps and is still
busy with a last step ("loaded"). Nothing else is patched.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from page_support import HANG_GUARD_S, button, rerun_until, set_tiny_encoder
from source_support import opened_source

from core import readiness, warmup
from core.kernels import dispatch
from core.lessons import induction
from core.training import decoder_runs, step_record

VIEWS = Path(__file__).resolve().parents[2] / "views"


def nothing() -> None:
    """A warm-up step that loads nothing: the test decides what has loaded."""


@pytest.fixture
def still_compiling(monkeypatch):
    """This server's warm-up has started and loaded neither compiled training step yet."""
    gate = threading.Event()
    warm = warmup.WarmUp(steps=(("the first kernels", lambda: gate.wait(HANG_GUARD_S)),
                                (warmup.ENCODER, nothing), (warmup.DECODER, nothing))).start()
    monkeypatch.setattr(readiness, "_started", warm)
    assert warmup.running() is warm and not warmup.ready(warmup.ENCODER) and not warmup.ready(warmup.DECODER)
    yield warm
    gate.set()


@pytest.fixture
def loaded(monkeypatch):
    """This server's warm-up has loaded both compiled training steps and still works on a last step."""
    gate = threading.Event()
    warm = warmup.WarmUp(steps=((warmup.ENCODER, nothing), (warmup.DECODER, nothing),
                                ("the last kernels", lambda: gate.wait(HANG_GUARD_S)))).start()
    monkeypatch.setattr(readiness, "_started", warm)
    end = time.monotonic() + HANG_GUARD_S
    while not (warm.has_done(warmup.ENCODER) and warm.has_done(warmup.DECODER)):
        assert time.monotonic() < end, "the warm-up did not run its do-nothing steps"
        time.sleep(0.01)
    assert warmup.running() is warm and warmup.ready(warmup.ENCODER) and warmup.ready(warmup.DECODER)
    yield warm
    gate.set()


def finish_loading(monkeypatch) -> None:
    """The compiled steps have loaded now (the warm-up has ended)."""
    monkeypatch.setattr(readiness, "_started", warmup.WarmUp(steps=()))
    assert warmup.ready(warmup.ENCODER) and warmup.ready(warmup.DECODER)


def open_page(file: str, hooks: dict) -> AppTest:
    at = AppTest.from_file(str(VIEWS / file), default_timeout=HANG_GUARD_S)
    for key, value in hooks.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def source_box(at: AppTest, start: str):
    found = [e for e in at.expander if e.label.startswith(start)]
    assert len(found) == 1, f"expected one expander {start!r}..., found {[e.label for e in at.expander]}"
    return opened_source(at, start)


def step_functions(model: str, track: str, cfg) -> list:
    """Every function one training step of ``cfg`` runs on ``track``, as a step recorded here says."""
    record = {"encoder": step_record.encoder_step, "decoder": step_record.decoder_step}[model]
    return dispatch.functions_behind(record(cfg, track))


# what only a training step runs (its loss's gradient, its backward pass), never a forward pass
TRAINING_ONLY = ("backward", "loss_and_grads", "gradient", "Gradient", "chunk")


def shows_the_step_functions(box, model: str, ran: str, cfg, forward_shown: bool = False) -> None:
    """The expander lists every function of ``ran``'s step and none that only the other step runs
    (``forward_shown``: the page lists forward passes of its own, so only the other step's gradient
    and backward functions must be absent)."""
    shown = texts(box.markdown)
    mine = step_functions(model, ran, cfg)
    other = [fn for fn in step_functions(model, "compiled" if ran == "readable" else "readable", cfg)
             if fn not in mine and (not forward_shown or any(word in fn.__qualname__ for word in TRAINING_ONLY))]
    missing = [fn.__qualname__ for fn in mine if f"{fn.__module__}.{fn.__qualname__}`" not in shown]
    stray = [fn.__qualname__ for fn in other if f"{fn.__module__}.{fn.__qualname__}`" in shown]
    assert not missing, f"the {ran} step's functions missing from {box.label!r}: {missing}"
    assert not stray, f"{box.label!r} lists functions only the other step runs: {stray}"


STATES = [pytest.param("still_compiling", "readable", id="compiled step still compiling: readable ran"),
          pytest.param("loaded", "compiled", id="compiled step loaded: compiled ran")]


@pytest.mark.parametrize("state, ran", STATES)
def test_train_an_encoder_names_the_step_that_ran(state, ran, request):
    request.getfixturevalue(state)
    at = open_page("training.py", {"training.data_sizes": (200, 40, 40), "training.poll_seconds": 0.2})
    set_tiny_encoder(at, "compiled")
    trainer = at.session_state["training.trainer"]
    try:
        button(at, "Start training").click().run()
        says_readable = "still compiles the compiled step" in texts(at.info)    # drawn as the run starts
        assert says_readable == (ran == "readable")
        rerun_until(at, lambda a: any(h.value == "Results" for h in a.subheader), "the 4-step run's results")
        assert trainer.view().runs[0].last["track"] == ran
        cfg = trainer.view().runs[0].spec.config()
        box = source_box(at, "Source: the")          # opened (a run of the page) while the run is there
    finally:
        trainer.reset()
    # (the reset forgets the run only after this page was drawn: the page read here is the finished run's)
    labels = [m.label for m in at.metric if m.label.startswith("ms per step")]
    assert labels == [f"ms per step ({ran} step)"]
    assert box.label == f"Source: the {ran} training step"
    shows_the_step_functions(box, "encoder", ran, cfg)


@pytest.mark.parametrize("state, ran", STATES)
def test_decoder_and_generation_names_the_step_that_ran(state, ran, request):
    request.getfixturevalue(state)
    at = open_page("decoder.py", {"decoder.poll_seconds": 0.2})
    at.number_input(key="decoder.steps").set_value(3)
    at.radio(key="decoder.track").set_value("compiled")
    at.run()
    trainer = at.session_state["decoder.trainer"]
    try:
        button(at, "Train").click().run()
        rerun_until(at, lambda a: not any("untrained" in w.value for w in a.warning), "the 3-step run's model")
        assert trainer.view().status == "done" and trainer.view().track == ran, trainer.view()
        box = source_box(at, "Source: generation")   # opened (a run of the page) while the run is there
    finally:
        trainer.reset()
    labels = [m.label for m in at.metric if m.label.startswith("ms per step")]
    assert labels == [f"ms per step ({ran} step)"]
    assert box.label == f"Source: generation, and the {ran} training step"
    # reverse is an encoder-decoder; the expander lists generation's forward passes too
    shows_the_step_functions(box, "decoder", ran, decoder_runs.build("reverse").cfg, forward_shown=True)


INDUCTION_STEPS = {"readable": 30, "compiled": 31}   # step counts no other test trains with (a shared cache)


@pytest.mark.parametrize("state, ran", STATES)
def test_induction_heads_names_the_step_its_model_trained_on(state, ran, request, monkeypatch):
    """A seed trained here trains once per server, on the step ready then; the page names that step
    for as long as it shows that model, also after the compiled step has loaded."""
    request.getfixturevalue(state)
    at = open_page("induction.py", {"induction.steps": INDUCTION_STEPS[ran]})
    at.number_input(key="induction.seed").set_value(11)
    button(at, "Train").click().run()
    assert not at.exception, at.exception

    def check() -> None:
        metric = [m for m in at.metric if m.label.startswith("training (")]
        assert [m.label for m in metric] == [f"training ({ran} step)"]
        assert ("still compiling the compiled one" in metric[0].help) == (ran == "readable")
        # the page lists the forward pass its measures and its head removals run
        shows_the_step_functions(source_box(at, "Source"), "decoder", ran, induction.InductionSetup().config,
                                 forward_shown=True)

    check()
    finish_loading(monkeypatch)
    at.run()
    check()


@pytest.mark.parametrize("state, ran", STATES)
def test_inside_a_trained_model_names_the_step_its_default_model_trained_on(state, ran, request, monkeypatch):
    request.getfixturevalue(state)
    hooks = {"inside_model.data_sizes": (200, 40, 60), "inside_model.steps": {"readable": 11, "compiled": 12}[ran]}
    at = open_page("inside_model.py", hooks)

    def check() -> None:
        origin = [c.value for c in at.caption if c.value.startswith("Using the default model")]
        assert len(origin) == 1 and f"trained on the {ran} training step" in origin[0], origin

    check()
    finish_loading(monkeypatch)
    at.run()
    check()
