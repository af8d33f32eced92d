"""Sessions kept apart. Streamlit serves every visitor from one process; each visit has its own
``st.session_state``. Two ``AppTest`` runs of one page are two such sessions in one process: what
one of them holds (a trainer, a run, a model, a generation, a verdict) must be its own object, and
what one of them does (a tiny run, a new seed, a head removed, an answer checked) must not show in
the other.

For every page that keeps state, one table row says how to open it cheaply (its test hooks), which
objects a session holds, and what a visitor does there. The test opens two sessions, reads what the
second shows, acts in the first until its page shows the result, then draws the second again: it
must show exactly what it showed before, and no run of its own.

Models read from the server's resource cache (the shipped small GPT, the default encoder, an
induction run for a seed) are shared by design and only read; the rows that act on them check
that acting in one session leaves the other's numbers as they were.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Callable

import pytest

from core.lessons import exercises
from streamlit.testing.v1 import AppTest

from page_support import HANG_GUARD_S, answer_question, button, rerun_until, set_tiny_encoder

from core.training.encoder_runs import EncoderRun
from ui.trainer import Trainer

VIEWS = Path(__file__).resolve().parents[2] / "views"


def texts(elements) -> list[str]:
    return [str(e.value) for e in elements]


def snapshot(at: AppTest, volatile: Callable[[str], bool] = lambda text: False) -> list[str]:
    """Everything the page shows a visitor, as text in page order by kind: metrics, text, tables,
    code and charts (their specs and data). A time in milliseconds written in the text (a kernel's
    timing) reads as "… ms", and ``volatile`` drops whatever else changes between two draws of the
    same state (a table of timings measured just now)."""
    shown = [f"metric {m.label}: {m.value}" for m in at.metric]
    for kind in ("title", "header", "subheader", "markdown", "caption", "latex", "code",
                 "info", "warning", "error", "success"):
        shown += [f"{kind} {value}" for value in texts(getattr(at, kind))]
    shown += [f"dataframe {d.value.to_csv()}" for d in at.dataframe]
    shown += [f"table {t.value.to_csv()}" for t in at.table]
    shown += [f"expander {e.label}" for e in at.expander]
    for chart in at.get("vega_lite_chart"):
        proto = chart.proto
        shown.append(f"chart {json.dumps(json.loads(proto.spec), sort_keys=True)} {proto.data.data.hex()} "
                     + " ".join(d.data.data.hex() for d in proto.datasets))
    return [re.sub(r"\d+(\.\d+)? ms\b", "… ms", line) for line in shown if not volatile(line)]


def difference(before: list[str], after: list[str]) -> str:
    """The first lines that differ, for an assertion message."""
    gone = [line for line in before if line not in after][:3]
    new = [line for line in after if line not in before][:3]
    return f"no longer shown: {[g[:200] for g in gone]}; newly shown: {[n[:200] for n in new]}"


# ----------------------------------------------------------------------------------------------
# the pages, one row each
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Page:
    """How to open a page as a visitor's session, and what a visitor does there.

    ``hooks`` are session-state test hooks set before the first run (tiny data, a fast poll);
    ``held(at)`` the objects the session keeps (each must be its own); ``act(at)`` does something
    and waits until the page shows it; ``shows_activity(at)`` whether the page shows a run, a
    result or a verdict of its own; ``volatile(line)`` what two draws of the same state may show
    differently."""

    name: str
    file: str
    hooks: dict
    held: Callable[[AppTest], list]
    act: Callable[[AppTest], None]
    shows_activity: Callable[[AppTest], bool]
    volatile: Callable[[str], bool] = lambda line: False
    link: dict = dataclasses.field(default_factory=dict)
    timeout: float = 120

    def open(self) -> AppTest:
        at = AppTest.from_file(str(VIEWS / self.file), default_timeout=self.timeout)
        for key, value in self.hooks.items():
            at.session_state[key] = value
        for name, value in self.link.items():
            at.query_params[name] = value
        at.run()
        assert not at.exception, f"{self.name}: {at.exception}"
        return at

    def close(self, at: AppTest) -> None:
        """Stop whatever the session still runs (a failed test must not leave a worker training)."""
        for value in self.held(at):
            if hasattr(value, "reset"):
                value.reset()


# "Train an encoder": a 4-step run of a one-layer model on the readable step
def train_encoder(at: AppTest) -> None:
    set_tiny_encoder(at, "readable")
    button(at, "Start training").click().run()
    rerun_until(at, lambda a: any(h.value == "Results" for h in a.subheader), "the 4-step run's results")


def encoder_run_shown(at: AppTest) -> bool:
    loss = [m.value for m in at.metric if m.label == "Loss (last batch)"]
    return bool(loss) and loss[0] != "–" or any(h.value == "Results" for h in at.subheader)


# "Decoder and generation": a 3-step run of the reverse task on the readable step
def train_decoder(at: AppTest) -> None:
    at.number_input(key="decoder.steps").set_value(3)
    at.radio(key="decoder.track").set_value("readable")
    at.run()
    button(at, "Train").click().run()
    rerun_until(at, lambda a: not any("untrained" in w.value for w in a.warning), "the 3-step run's model")


def decoder_run_shown(at: AppTest) -> bool:
    loss = [m.value for m in at.metric if m.label == "Loss (last batch)"]
    untrained = any("untrained" in w.value for w in at.warning)
    return bool(loss) and loss[0] != "–" or not untrained


def decoder_timing(line: str) -> bool:
    """The generation timings: measured afresh whenever the page draws them."""
    return "ms per token" in line or "warm calls" in line


# "Induction heads": another seed, submitted through the form, trains its own model
INDUCTION_STEPS = 40          # a step count no other test file trains with: the resource cache is the process's


def induction_new_seed(at: AppTest) -> None:
    at.number_input(key="induction.seed").set_value(7)
    button(at, "Train").click().run()
    assert at.query_params.get("seed") == "7", "the form did not submit the seed"


def induction_seed_shown(at: AppTest) -> bool:
    return at.number_input(key="induction.seed").value == 7


# "Inside a trained model": its opening question answered (which opens the removal of heads), heads
# removed from the default model (the server's, shared), then the training page's finished run
# taken apart
def finished_encoder_run() -> Trainer:
    trainer = Trainer()
    trainer.start(EncoderRun(task="sum", n_layers=1, d_model=16, n_heads=2, steps=5, n_train=200, n_val=40, n_test=60))
    assert trainer.join(HANG_GUARD_S), f"the 5-step encoder run had not ended after {HANG_GUARD_S:.0f} s"
    assert trainer.status == "done"
    return trainer


def take_apart(at: AppTest) -> None:
    from core.lessons import questions

    opening = questions.opening("inside_model")
    answer_question(at, opening, opening.options[opening.answer])
    at.multiselect(key="inside_model.remove_heads").set_value(["L1H1", "L2H3"]).run()
    at.radio(key="inside_model.mode").set_value("mean").run()
    at.session_state["training.trainer"] = finished_encoder_run()   # what "Train an encoder" keeps
    at.run()
    at.radio(key="inside_model.source").set_value("trained").run()


def own_run_shown(at: AppTest) -> bool:
    return any("your run from" in c.value for c in at.caption)


# "A real model": its opening question answered (which opens the choice of a head), a head removed on
# the text both sessions show (the forward pass of a text is the server's, shared), then another text
# and another seed for the generation
def edit_real_model(at: AppTest) -> None:
    from core.lessons import questions

    opening = questions.opening("real_model")
    answer_question(at, opening, opening.options[opening.answer])
    for control, value in ((at.number_input(key="real_model.layer"), 2), (at.number_input(key="real_model.head"), 2),
                           (at.radio(key="real_model.how"), "mean"), (at.number_input(key="real_model.seed"), 5),
                           (at.text_area(key="real_model.text"), "the key and the value give a weight to each query")):
        control.set_value(value).run()
        assert not at.exception, at.exception


def real_model_edit_shown(at: AppTest) -> bool:
    return any(h.value.startswith("Remove or patch head L2H2") for h in at.header)


# "Check yourself": one exercise answered and checked
def check_an_answer(at: AppTest) -> None:
    at.slider(key="cy_gain").set_value(round(exercises.first_token_gain_needed() + 0.1, 1))
    at.button(key="cy_gain_check").click().run()


def verdict_shown(at: AppTest) -> bool:
    return bool(at.success) or any(m.label == "Exercises passed" and m.value != "0 of 2" for m in at.metric)


PAGES = [
    Page("Train an encoder", "training.py",
         {"training.data_sizes": (200, 40, 40), "training.poll_seconds": 0.2},
         lambda at: [at.session_state["training.trainer"], at.session_state["training.ablation_trainer"]],
         train_encoder, encoder_run_shown),
    Page("Decoder and generation", "decoder.py", {"decoder.poll_seconds": 0.2},
         lambda at: [at.session_state["decoder.trainer"], at.session_state["decoder.memo"]],
         train_decoder, decoder_run_shown, volatile=decoder_timing),
    Page("Induction heads", "induction.py", {"induction.steps": INDUCTION_STEPS},
         lambda at: [], induction_new_seed, induction_seed_shown),
    Page("Inside a trained model", "inside_model.py",
         {"inside_model.data_sizes": (200, 40, 60), "inside_model.steps": 20},
         lambda at: [at.session_state[key] for key in ("training.trainer",) if key in at.session_state],
         take_apart, own_run_shown),
    Page("A real model", "real_model.py", {}, lambda at: [], edit_real_model, real_model_edit_shown,
         link={"which": "tiny_gpt"}),
    Page("Check yourself", "check_yourself.py", {}, lambda at: [at.session_state["cy_verdicts"]],
         check_an_answer, verdict_shown),
]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_two_sessions_hold_their_own_objects_and_see_only_their_own_runs(page: Page):
    first, second = page.open(), page.open()
    try:
        # each session holds its own trainers, runs and records: no object of one is the other's
        mine, theirs = page.held(first), page.held(second)
        assert len(mine) == len(theirs)
        shared = [type(a).__name__ for a in mine for b in theirs if a is b]
        assert not shared, f"{page.name}: both sessions hold the same {shared}"
        assert not page.shows_activity(second), f"{page.name}: a fresh session shows a run already"
        before = snapshot(second, page.volatile)

        page.act(first)
        assert not first.exception, f"{page.name}: {first.exception}"
        assert page.shows_activity(first), f"{page.name}: the session that acted does not show it"
        assert snapshot(first, page.volatile) != before, f"{page.name}: acting changed nothing on the page"

        second.run()
        assert not second.exception, f"{page.name}: {second.exception}"
        assert not page.shows_activity(second), f"{page.name}: the other session shows the first one's run"
        after = snapshot(second, page.volatile)
        assert after == before, f"{page.name}: the other session's page changed: {difference(before, after)}"
        # and what it holds is still its own, whatever the first session made meanwhile
        shared = [type(a).__name__ for a in page.held(first) for b in page.held(second) if a is b]
        assert not shared, f"{page.name}: both sessions hold the same {shared}"
    finally:
        page.close(first)
        page.close(second)
