"""The "Decoder and generation" page through Streamlit's AppTest: it reads the numbers the page
shows (tables, metrics) and checks that each control moves them as it should."""
import inspect
import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.lessons import kv_cache
from core.model import transformer, transformer_encdec
from core.training.decoder_runs import DEFAULTS
from core.lessons.questions import decoder as questions
from page_support import answer_everything, answer_question, heatmap_grids, table_named
from source_support import opened_source, source_names
from ui.decoder_trainer import EVAL_EVERY

TRAINER = "decoder.trainer"


def page(*, answered: bool = True) -> AppTest:
    """The page in a fresh session; ``answered``: its questions answered and the comparison with a
    full recompute (section 4) switched on."""
    at = AppTest.from_file("../../views/decoder.py", default_timeout=120)
    at.session_state["decoder.poll_seconds"] = 0.2
    if answered:
        answer_everything(at)
        at.session_state["decoder.compare"] = True
    return at


@pytest.fixture
def at():
    app = page()
    yield app
    if TRAINER in app.session_state:
        app.session_state[TRAINER].reset()


def metric(at, start: str) -> str:
    found = [m.value for m in at.metric if m.label.startswith(start)]
    assert len(found) == 1, f"expected one metric starting {start!r}, found {found}"
    return found[0]


def button(at, label):
    return next(b for b in at.button if b.label == label)


def distribution(at):
    return table_named(at, "token")


def cost_table(at):
    """The KV-cache timing table (an ``st.table``, indexed by generation)."""
    found = [t.value for t in at.table if "positions computed" in t.value.columns]
    assert len(found) == 1
    return found[0]


def errors(at) -> str:
    return " ".join(e.value for e in at.error)


def test_page_shows_teacher_forcing_generation_and_the_cache_agreement(at):
    at.run()
    assert not at.exception and not at.error
    assert len(at.latex) >= 5
    tf = table_named(at, "position")
    assert list(tf.columns[:3]) == ["source", "decoder input", "target"]
    # the decoder input is the target shifted right, after the start symbol
    assert tf["decoder input"].iloc[0] == "^"
    assert list(tf["decoder input"].iloc[1:]) == list(tf["target"].iloc[:-1])
    # reverse: the target is the source backwards
    assert list(tf["target"]) == list(tf["source"])[::-1]
    # cached and recomputed generation agree, and the recompute runs 1 + 2 + ... + 8 positions
    assert float(metric(at, "Largest |logit difference|")) < 1e-4
    assert metric(at, "Same tokens written") == "yes"
    cost = cost_table(at)
    assert cost.loc["with the KV cache", "positions computed"] == "8"
    assert cost.loc["full recompute", "positions computed"] == str(sum(range(1, 9)))
    assert "Source" in " ".join(e.label for e in at.expander)


def test_stepping_grows_the_attention_row_and_the_cache(at):
    at.run()
    row1, k1 = table_named(at, "self-attention"), table_named(at, "K")
    assert row1.shape[1] == 1 and len(k1) == 1
    assert metric(at, "Rows in the K/V cache") == "1"
    button(at, "Next ▶").click().run()
    row2, k2 = table_named(at, "self-attention"), table_named(at, "K")
    assert row2.shape[1] == 2 and len(k2) == 2                      # one more key, one more cached row
    np.testing.assert_allclose(row2.to_numpy(float).sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(k2.to_numpy(float)[0], k1.to_numpy(float)[0])   # earlier rows never change
    assert metric(at, "Rows in the K/V cache") == "2"
    at.slider(key="decoder.step").set_value(8).run()
    assert table_named(at, "self-attention").shape[1] == 8 and len(table_named(at, "V")) == 8
    assert table_named(at, "cross-attention").shape[1] == 8          # always the whole source
    button(at, "◀ Previous").click().run()
    assert table_named(at, "self-attention").shape[1] == 7


def test_sampler_controls_move_the_distribution_and_the_allowed_set(at):
    at.run()
    d1 = distribution(at)
    assert d1["allowed"].all()                                       # no filter: every token allowed
    at.number_input(key="decoder.temperature").set_value(2.0).run()
    d2 = distribution(at)
    # a hotter softmax is flatter: its largest probability falls
    assert d2["p before top-k/top-p"].max() < d1["p before top-k/top-p"].max()
    at.text_input(key="decoder.top_k").input("3").run()
    d3 = distribution(at)
    assert d3["allowed"].sum() == 3
    top3 = d3["p before top-k/top-p"].nlargest(3).index
    assert set(d3.index[d3["allowed"]]) == set(top3)
    np.testing.assert_allclose(d3["p sampled from"].sum(), 1.0)
    assert (d3.loc[~d3["allowed"], "p sampled from"] == 0).all()
    at.text_input(key="decoder.top_k").input("").run()
    at.number_input(key="decoder.top_p").set_value(0.3).run()
    d4 = distribution(at)
    kept = d4.loc[d4["allowed"], "p before top-k/top-p"]
    assert 1 <= len(kept) < len(d4)
    assert kept.sum() >= 0.3 and kept.sum() - kept.min() < 0.3     # the fewest likeliest reaching 0.3
    at.number_input(key="decoder.temperature").set_value(0.0).run()
    d5 = distribution(at)
    assert d5["allowed"].sum() == 1 and d5["picked"].equals(d5["allowed"])   # greedy
    assert not at.error


@pytest.mark.parametrize("field, value, message", [
    ("top_k", "0", "top-k must be a whole number >= 1"),
    ("top_k", "two", "top-k must be a whole number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_p", 1.5, "top_p should be a number from 0 to 1"),                  # refused before the page reads it
    ("temperature", -1.0, "temperature should be a number from 0 to 100"),
])
def test_bad_sampler_settings_show_an_error_and_change_nothing_else(at, field, value, message):
    at.run()
    at.number_input(key="decoder.temperature").set_value(0.5).run()     # a good non-default value to keep
    at.text_input(key="decoder.top_k").input("4").run()
    button(at, "Next ▶").click().run()
    assert not at.error and distribution(at)["allowed"].sum() == 4
    before_dist, before_cost = distribution(at), cost_table(at)["positions computed"]
    widget = at.text_input(key=f"decoder.{field}") if field == "top_k" else at.number_input(key=f"decoder.{field}")
    (widget.input(value) if field == "top_k" else widget.set_value(value)).run()
    assert not at.exception
    assert message in errors(at) + " ".join(w.value for w in at.warning)
    assert distribution(at).equals(before_dist)
    assert cost_table(at)["positions computed"].equals(before_cost)
    assert metric(at, "Rows in the K/V cache") == "2"


@pytest.mark.parametrize("prompt, message", [
    ("", "The prompt is empty"),
    ("attention #", "Unknown character"),
    ("a" * 40, "longer than the model's context of 32"),
])
def test_bad_prompts_show_an_error_and_change_nothing_else(at, prompt, message):
    at.run()
    at.selectbox(key="decoder.task").set_value("lm").run()
    assert not at.error
    before = distribution(at)
    written = [m.value for m in at.markdown if m.value.startswith("Prompt `")]
    at.text_input(key="decoder.prompt").input(prompt).run()
    assert not at.exception
    assert message in errors(at)
    assert distribution(at).equals(before)
    assert [m.value for m in at.markdown if m.value.startswith("Prompt `")] == written
    at.text_input(key="decoder.prompt").input("the ").run()           # a good prompt is taken again
    assert not at.error
    assert [m.value for m in at.markdown if m.value.startswith("Prompt `")][0].startswith("Prompt `the␣`")


def test_a_short_run_trains_and_replaces_the_model_shown(at):
    at.run()
    before = table_named(at, "position")["p(target)"].to_numpy()
    at.number_input(key="decoder.steps").set_value(5).run()
    button(at, "Train").click().run()
    trainer = at.session_state[TRAINER]
    assert trainer.join(120)
    at.run()
    view = trainer.view()
    assert view.status == "done" and view.step == 5 and len(view.metrics) == 5
    assert [e["step"] for e in view.evals] == [0, 5]                 # the start and the end
    assert not at.exception and not at.error
    assert metric(at, "Loss (last batch)") == f"{view.metrics[-1]['loss']:.4f}"
    after = table_named(at, "position")["p(target)"].to_numpy()
    assert not np.allclose(before, after)                            # the trained weights are shown
    assert not any("untrained" in w.value for w in at.warning)
    button(at, "Reset").click().run()
    assert any("untrained" in w.value for w in at.warning)
    np.testing.assert_allclose(table_named(at, "position")["p(target)"].to_numpy(), before)


def test_a_run_measures_the_validation_metric_as_it_trains(at):
    at.run()
    at.number_input(key="decoder.steps").set_value(250).run()
    button(at, "Train").click().run()
    trainer = at.session_state[TRAINER]
    assert trainer.join(120)
    evals = trainer.view().evals
    assert [e["step"] for e in evals] == [0, EVAL_EVERY, 2 * EVAL_EVERY, 250]
    assert evals[-1]["value"] > evals[0]["value"]                  # the reverse task is being learned
    at.run()
    assert not at.exception and not at.error


def test_stop_ends_a_run_early_and_keeps_its_model(at):
    at.run()
    at.number_input(key="decoder.steps").set_value(2000).run()
    button(at, "Train").click().run()
    trainer = at.session_state[TRAINER]
    end = time.monotonic() + 60
    while trainer.view().step < 3 and time.monotonic() < end:
        time.sleep(0.1)
    at.run()
    button(at, "Stop").click().run()
    view = trainer.view()
    assert view.status == "stopped" and 3 <= view.step < 2000
    assert "Stopped at step" in view.message
    assert trainer.model(trainer._setup)[2]                          # trained weights kept


def test_the_decoder_trainer_waits_in_the_servers_training_queue(monkeypatch):
    import threading

    from core.training.decoder_runs import build
    from ui import background_run
    from ui.decoder_trainer import DecoderTrainer

    queue = background_run.TrainingQueue(1)
    monkeypatch.setattr(background_run, "QUEUE", queue)
    release = threading.Event()
    holder = threading.Thread(target=lambda: queue.wait_turn(threading.Event(), lambda *a: None) and release.wait(30))
    holder.start()                                   # an encoder run holds the only slot
    trainer = DecoderTrainer()
    trainer.start(build("reverse"), 3)
    deadline = time.time() + 20
    while "place 1 in the queue" not in trainer.view().message and time.time() < deadline:
        time.sleep(0.05)
    view = trainer.view()
    assert view.status == "queued" and view.metrics == [] and trainer.running
    release.set()
    holder.join()
    queue.release()
    assert trainer.join(120) and trainer.view().status == "done"
    assert queue.counts() == (0, 0)                  # and the worker gave its slot back


def test_the_decoder_trainer_trains_with_the_loop_it_is_given():
    """The training loop is the caller's choice (``fit``); without one, decoder_runs.fit."""
    from core.training.decoder_runs import build, fit
    from ui.decoder_trainer import DecoderTrainer

    calls = []

    def counted(setup, **kw):
        calls.append(kw["steps"])
        return fit(setup, **kw)

    trainer = DecoderTrainer()
    trainer.start(build("reverse"), 3, fit=counted)
    assert trainer.join(120) and trainer.view().status == "done"
    assert calls == [3] and trainer.view().step == 3


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_a_link_to_a_task_opens_with_that_tasks_step_count_and_keeps_a_chosen_one(task):
    """A link names the task only: the Steps box shows that task's own default (the caption's),
    and the link leaves the count out; a count typed in goes into the link and comes back from it."""
    from core.training.decoder_runs import DEFAULTS
    at = page()
    at.query_params["task"] = task
    at.run()
    steps = next(n for n in at.number_input if n.label.startswith("Steps"))
    assert steps.value == DEFAULTS[task].steps and f"default is {DEFAULTS[task].steps}" in steps.label
    assert "steps" not in at.query_params
    steps.set_value(123).run()
    assert at.query_params["steps"] == "123"
    again = page()
    again.query_params.update(task=task, steps="123")
    again.run()
    assert next(n for n in again.number_input if n.label.startswith("Steps")).value == 123


@pytest.mark.parametrize("precision, low, high", [("float64", 0.0, 1e-12), ("float32", 1e-9, 1e-4)])
def test_the_sidebar_precision_is_the_one_that_runs(at, precision, low, high):
    """float64 in the sidebar: cached and recomputed logits agree to ~1e-15, not float32's ~1e-6."""
    at.session_state["precision_choice"] = precision
    at.run()
    assert not at.exception and not at.error
    assert low <= float(metric(at, "Largest |logit difference|")) < high
    assert any(f"weights in **{precision}**" in c.value for c in at.caption)


def test_the_timing_table_shows_whole_numbers_and_says_whether_the_cache_paid(at):
    at.run()
    cost = cost_table(at)
    times = cost[[c for c in cost.columns if c.startswith("ms per token")][0]]
    assert all(len(t.split(".")[1]) == 3 and float(t) > 0 for t in times)        # 0.123, not "0" or "1"
    note = " ".join(c.value for c in at.caption if "warm calls" in c.value)
    cached, full = (float(times[name]) for name in ("with the KV cache", "full recompute"))
    assert ("did not pay" in note) == (cached >= 0.9 * full) and ("faster per token" in note) == (cached < 0.9 * full)
    assert "fewer positions computed" in " ".join(h.value for h in at.header)
    assert "less work" not in " ".join(h.value for h in at.header)


def test_one_box_says_the_weights_are_untrained(at):
    at.run()
    boxes = [b.value for b in (*at.info, *at.warning) if "untrained" in b.value]
    assert len(boxes) == 1, boxes


def step_source(at) -> str:
    box = opened_source(at, "Source: generation")
    return box.label + " " + " ".join(c.value for c in box.code)


def test_a_decoder_only_model_shows_the_forward_pass_its_numbers_came_from():
    """The language model has no encoder: the source shows the one transformer's forward pass as
    teacher forcing and generation call it (the parameters checked once, before it), nothing else.
    (The compiled step is one Numba function for every decoder: its code holds the cross-attention
    an encoder-decoder runs, so the readable encoder-decoder's functions are the ones to look for.)"""
    at = page()
    at.query_params["task"] = "lm"
    at.run()
    src = step_source(at)
    assert "def forward_checked(" in src and "def self_attention(" in src
    assert "def encode(" not in src and inspect.getsource(transformer_encdec.decoder_block) not in src
    assert inspect.getsource(transformer.forward) not in src       # the checking wrapper neither of them calls


def test_the_step_switch_changes_the_source_and_the_milliseconds(at):
    """A short run on each training step: the ms-per-step metric names the step that ran and reads
    that run's time, and the source expander shows that step's functions (cross-attention's
    included: the reverse task is an encoder-decoder)."""
    at.run()
    at.number_input(key="decoder.steps").set_value(12).run()
    readings = {}
    for track in ("readable", "compiled"):
        at.radio(key="decoder.track").set_value(track).run()
        button(at, "Train").click().run()
        trainer = at.session_state[TRAINER]
        assert trainer.join(120)
        at.run()
        view = trainer.view()
        assert view.track == track and view.step == 12
        shown = metric(at, f"ms per step ({track} step)")
        assert float(shown) == pytest.approx(view.metrics[-1]["ms_per_step"], abs=0.006)
        readings[track] = (float(shown), step_source(at))
        codes = [c.value for c in opened_source(at, "Source: generation").code]
        assert len(codes) == len(set(codes)), "a function is shown twice"
    (ms_r, src_r), (ms_c, src_c) = readings["readable"], readings["compiled"]
    assert "def encode(" in src_r and "def decoder_block(" in src_r        # this model's stacks ran
    assert "def forward_checked(" in src_r and "def forward_checked(" in src_c   # the body behind forward
    assert "the readable training step" in src_r and "def decoder_block_backward(" in src_r
    readable_twin = "the readable twin of ``decoder_step.Gradient``"      # decoder.loss_and_grads's docstring
    assert readable_twin in src_r and "def decoder_chunk(" not in src_r
    assert "the compiled training step" in src_c and "def decoder_chunk(" in src_c
    assert readable_twin not in src_c
    assert ms_r > ms_c                 # the readable step runs Python between its sublayers


# ----------------------------------------------------------------------------------------------
# the opening question, the KV cache's work, and sentences that follow the measured numbers
# ----------------------------------------------------------------------------------------------
def test_the_opening_question_locks_the_comparison_and_its_answer_is_what_the_page_shows():
    at = page(answered=False)
    at.run()
    assert not at.exception and not at.error
    toggle = at.toggle(key="decoder.compare")
    assert toggle.disabled
    assert not any(m.label.startswith("Largest |logit difference|") for m in at.metric)
    assert not any("agree" in c.value for c in at.caption)             # the precision note keeps the answer back
    answer_question(at, questions.CACHE, questions.CACHE.options[questions.CACHE.answer])
    assert not at.toggle(key="decoder.compare").disabled
    at.toggle(key="decoder.compare").set_value(True).run()
    same = float(metric(at, "Largest |logit difference|")) < 1e-9 and metric(at, "Same tokens written") == "yes"
    assert questions.CACHE.answer == (0 if same else 1)
    assert questions.CACHE.answer == 0                                 # the KV cache changes no logit


def steps_and_prompt(at) -> tuple[int, int]:
    """(n, P) as the page shows them: its last generation step, and the positions run at step 1."""
    at.slider(key="decoder.step").set_value(1).run()
    P = int(metric(at, "Positions run through the decoder at this step"))
    return int(at.slider(key="decoder.step").max), P


@pytest.mark.parametrize("task", ["reverse", "lm"])
def test_the_work_table_counts_positions_and_scores_as_the_formulas_say(at, task):
    """The cache saves positions (T against T²) but not attention's reads (T² against T³): the table's
    counts are the formulas' for the page's own P and n, and the note quotes them. The language model's
    prompt of 10 characters enters the cache at once at step 1, not one row a step."""
    at.run()
    if task == "lm":
        at.selectbox(key="decoder.task").set_value("lm").run()
    n, P = steps_and_prompt(at)
    assert metric(at, "Rows in the K/V cache after this step") == str(P)
    assert f"At step 1 the whole prompt enters each cache at once ({P} row" in " ".join(c.value for c in at.caption)
    if task == "lm":
        assert P == len(kv_cache.LM_PROMPT) > 1
        at.slider(key="decoder.step").set_value(2).run()
        assert metric(at, "Rows in the K/V cache after this step") == str(P + 1)
        assert metric(at, "Positions run through the decoder at this step") == "1"
    reads = np.arange(P, P + n)                                       # positions read at each step
    want = {"with the KV cache": (P + n - 1, P * P + reads[1:].sum()),
            "full recompute": (reads.sum(), (reads ** 2).sum())}
    cost = cost_table(at)
    for row, (positions, scores) in want.items():
        assert cost.loc[row, "positions computed"] == f"{positions:,}"
        assert cost.loc[row, "query–key scores per head and layer"] == f"{scores:,}"
    note = " ".join(c.value for c in at.caption if c.value.startswith("The cache runs each position"))
    (cached_pos, cached_scores), (full_pos, full_scores) = want.values()
    assert (f"{cached_pos:,} positions here against the recompute's {full_pos:,} (growing as T against T²)" in note
            and f"computes {cached_scores:,} query–key scores per head and layer against the recompute's "
                f"{full_scores:,} (growing as T² against T³)" in note)
    if task == "reverse":                                              # the question asked beside the table
        assert questions.SCORES.answer == cached_scores


def anti_diagonal_of_grid(at) -> np.ndarray:
    """Each head's mean cross-attention weight on the anti-diagonal, read from the page's grid."""
    (grid,) = heatmap_grids(at)
    maps = np.stack(list(grid.values()))                               # (L H, T, S)
    T, S = maps.shape[1:]
    return maps[:, np.arange(T), S - 1 - np.arange(T)].mean(axis=1)


def reads_from_end(at) -> str:
    return " ".join(m.value for m in at.markdown if m.value.startswith("Cross-attention of validation example"))


@pytest.mark.parametrize("steps", [None, 5, 400])
def test_a_head_reads_the_source_from_its_end_only_when_the_maps_show_it(at, steps):
    """Untrained (the page as it opens) and after 5 steps no head's cross-attention lies on the
    anti-diagonal, and the page says so; after the reverse task's 400 default steps one does, and the
    page names it with the weight its map shows."""
    at.run()
    if steps is not None:
        at.number_input(key="decoder.steps").set_value(steps).run()
        button(at, "Train").click().run()
        assert at.session_state[TRAINER].join(300)
        at.run()
        assert not any("untrained" in w.value for w in at.warning)
    weight = anti_diagonal_of_grid(at)
    said = reads_from_end(at)
    best, head = weight.max(), int(np.argmax(weight))
    H = DEFAULTS["reverse"].n_heads
    name = f"L{head // H + 1}H{head % H + 1}"
    if steps == 400:
        assert best >= kv_cache.READS_FROM_END
        assert f"Here head {name} reads the source from its end" in said and f"on average {best:.2f}" in said
    else:
        assert best < kv_cache.READS_FROM_END
        assert "No head reads the source from its end" in said and f"is {best:.2f} on average ({name})" in said


def test_the_source_names_the_functions_that_ran_and_no_other(at):
    """Teacher forcing, generation and the sampler always run; the comparison of the cached and the
    recomputed generations only when it is switched on: then, and only then, the source holds it."""
    at.session_state["decoder.compare"] = False
    at.run()
    off = source_names(at, "Source: generation")
    assert {"core.model.decoder.forward", "core.model.generation.generate", "core.model.sampling.distribution",
            "core.model.generation.attention_weights"} <= set(off)
    compared = {"core.lessons.kv_cache.largest_logit_difference", "core.lessons.kv_cache.work"}
    assert not compared & set(off)
    at.toggle(key="decoder.compare").set_value(True).run()
    assert compared <= set(source_names(at, "Source: generation"))


# --- the numbers the page claims, recomputed from the model ------------------------------------------

def _distribution(at):
    return table_named(at, "token")


def test_decoder_page_samples_at_the_temperature_chosen():
    """Fails when the page passes another temperature to ``generate`` than the one chosen (every
    τ != 0 replaced by 1): without top-k or top-p, the distribution generation sampled from must be
    softmax(z/τ), the bars the page computes from the logits at τ, and it must move with τ."""
    at = page()
    at.run()
    d1 = _distribution(at)
    np.testing.assert_allclose(d1["p sampled from"], d1["p before top-k/top-p"], atol=1e-6)
    for tau in (2.0, 0.5):
        at.number_input(key="decoder.temperature").set_value(tau).run()
        assert not at.error
        d = _distribution(at)
        np.testing.assert_allclose(d["p sampled from"], d["p before top-k/top-p"], atol=1e-6, err_msg=str(tau))
        assert np.abs(d["p sampled from"].to_numpy() - d1["p sampled from"].to_numpy()).max() > 1e-3
