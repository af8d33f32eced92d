"""The training page through Streamlit's AppTest: tiny data and step counts via session state."""
import io
import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core import encoder, limits, tasks
from core.lessons.questions import training as questions
from core.model import encoder_io, transformer
from core.training.encoder_runs import EncoderRun
from page_support import answer_everything, answer_question
from source_support import opened_source
from ui.trainer import Trainer

SIZES = (200, 40, 40)   # train / validation / test sequences: fast enough for a test


def page(*, answered: bool = True) -> AppTest:
    at = AppTest.from_file("../../views/training.py", default_timeout=60)
    at.session_state["training.data_sizes"] = SIZES
    at.session_state["training.poll_seconds"] = 0.2
    if answered:
        answer_everything(at)
    return at


def trainer_of(at) -> Trainer:
    return at.session_state["training.trainer"]


def texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def button(at, label):
    return next(b for b in at.button if b.label == label)


def rerun_until(at, predicate, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        at.run()
        if predicate(at):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def at():
    app = page()
    yield app
    for key in ("training.trainer", "training.ablation_trainer"):
        if key in app.session_state:
            app.session_state[key].reset()


def test_page_renders_with_caps_formulas_and_controls(at):
    at.run()
    assert not at.exception and not at.error
    labels = [b.label for b in at.button]
    for label in ("Start training", "Pause", "Resume", "Reset", "Run the ablations"):
        assert label in labels
    assert len(at.latex) >= 5
    captions = texts(at.caption)
    assert str(limits.MAX_TRAIN_STEPS) in captions and f"{limits.MAX_TRAIN_SECONDS:.0f} s" in captions
    assert "median" in captions            # the chosen task's one-line description
    assert at.selectbox(key="training.task").options == ["sum", "increasing", "repeat"]
    # the encoder adds its positions to the embeddings: no rotary choice, which it could not train
    assert at.radio(key="training.positional").options == ["sinusoidal", "learned", "none"]


@pytest.fixture(scope="module")
def compiled():
    """Compile the training kernels once, outside the page: on a cold cache the compile can outlast
    a run's time cap, and the page's run would stop at its first step."""
    warm = Trainer()
    warm.start(EncoderRun(task="increasing", n_layers=1, d_model=16, n_heads=2, positional="learned", steps=2,
                       n_train=SIZES[0], n_val=SIZES[1], n_test=SIZES[2]))
    assert warm.join(600)
    warm.reset()


def test_a_short_run_shows_metrics_then_results_and_reset_clears(at, compiled):
    at.run()
    at.number_input(key="training.steps").set_value(30)
    at.number_input(key="training.d_model").set_value(16)
    at.slider(key="training.layers").set_value(1)
    at.number_input(key="training.heads").set_value(2)
    at.selectbox(key="training.task").set_value("increasing")
    at.radio(key="training.positional").set_value("learned")
    at.select_slider(key="training.lr").set_value("0.01")
    at.run()
    button(at, "Start training").click().run()
    assert not at.exception and not at.error
    assert rerun_until(at, lambda a: any(m.label == "Loss (last batch)" and m.value != "–" for m in a.metric))
    assert rerun_until(at, lambda a: trainer_of(a).status == "done")
    at.run()
    assert not at.exception and not at.error
    run = trainer_of(at).view().runs[0]
    assert run.step == 30 and run.spec.task == "increasing" and run.spec.lr == 0.01
    # the model trained is the one the controls describe: its arrays say so
    params, cfg = trainer_of(at).params()
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.positional) == (1, 2, 16, "learned")
    assert params["embed"].shape[1] == 16 and params["pos"].shape == (cfg.n_ctx, 16)
    assert "blocks.0.attn.W_Q" in params and "blocks.1.attn.W_Q" not in params
    assert run.attention.shape == (1, 2, cfg.n_ctx, cfg.n_ctx)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Loss (last batch)"] == f"{run.last['loss']:.4f}"
    assert float(metrics["Validation accuracy"]) == pytest.approx(run.final_val_acc, abs=1e-3)
    # the validation example whose attention is drawn is the one asked for
    at.number_input(key="training.example").set_value(3).run()
    data = tasks.make_dataset("increasing", *SIZES, seed=0)
    shown = " ".join(m.value for m in at.markdown)
    assert (f"on validation example 3 (tokens `{' '.join(map(str, data.X_val[3]))}`, "
            f"label {data.y_val[3]})") in shown
    assert any(label.startswith("Test accuracy") for label in metrics)
    assert len(at.table) >= 1                       # the confusion table
    assert "reached the step count" in texts(at.caption)
    button(at, "Reset").click().run()
    assert trainer_of(at).view().runs == [] and not at.exception
    assert not any(label.startswith("Test accuracy") for label in (m.label for m in at.metric))


def test_pause_and_resume_from_the_page(at):
    at.run()
    at.number_input(key="training.steps").set_value(limits.MAX_TRAIN_STEPS)
    at.run()
    button(at, "Start training").click().run()
    assert rerun_until(at, lambda a: trainer_of(a).view().runs[0].step > 0)
    button(at, "Pause").click().run()
    assert trainer_of(at).status == "paused" and not at.exception
    step = trainer_of(at).view().runs[0].step
    at.run()
    assert trainer_of(at).view().runs[0].step == step
    button(at, "Resume").click().run()
    assert rerun_until(at, lambda a: trainer_of(a).view().runs[0].step > step)
    button(at, "Reset").click().run()
    assert trainer_of(at).status == "idle"


def test_heads_that_do_not_divide_d_model_give_a_message_and_no_start(at):
    at.run()
    at.number_input(key="training.d_model").set_value(30).run()
    assert "cannot be split evenly" in texts(at.error)
    assert button(at, "Start training").disabled
    assert not at.exception


def test_bad_upload_bytes_give_a_message_and_change_nothing(at):
    at.run()
    at.session_state["training.upload_bytes"] = b"this is not an npz file"
    at.run()
    assert "not a valid .npz" in texts(at.error) and "Nothing was changed" in texts(at.error)
    assert trainer_of(at).view().runs == [] and not at.exception
    at.session_state["training.upload_bytes"] = b"x" * (limits.MAX_UPLOAD_MB * 2 ** 20 + 1)
    at.run()
    assert f"at most {limits.MAX_UPLOAD_MB:g} MB" in texts(at.error)
    # an archive with the wrong arrays
    buffer = io.BytesIO()
    np.savez(buffer, embed=np.zeros((10, 8)), something_else=np.ones(3))
    at.session_state["training.upload_bytes"] = buffer.getvalue()
    at.run()
    assert at.error and trainer_of(at).view().runs == [] and not at.exception


def test_good_upload_is_loaded_and_evaluated(at):
    source = Trainer()        # 2 heads and no positional encoding, unlike the page's settings
    source.start(EncoderRun(task="sum", n_layers=1, d_model=16, n_heads=2, positional="none", steps=10,
                         n_train=SIZES[0], n_val=SIZES[1], n_test=SIZES[2]))
    assert source.join(30)
    at.run()
    at.session_state["training.upload_bytes"] = source.weights_npz()
    at.run()
    assert not at.exception and not at.error
    assert "Loaded test upload" in texts(at.success) and "does not record" not in texts(at.caption)
    assert trainer_of(at).view().runs[0].spec.n_heads == 2
    assert trainer_of(at).view().runs[0].spec.positional == "none"
    view = trainer_of(at).view()
    assert view.status == "loaded" and view.runs[0].test_acc == source.view().runs[0].test_acc
    assert any(m.label.startswith("Test accuracy") for m in at.metric)
    params, _ = trainer_of(at).params()
    np.testing.assert_array_equal(params["embed"], source.params()[0]["embed"])
    assert set(encoder_io.load(trainer_of(at).weights_npz())) == set(params)


def test_ablations_run_in_the_worker_and_show_side_by_side(at):
    at.run()
    at.number_input(key="training.ablation_steps").set_value(8).run()
    button(at, "Run the ablations").click().run()
    abl = at.session_state["training.ablation_trainer"]
    assert rerun_until(at, lambda a: abl.status == "done", timeout=40)
    at.run()
    assert not at.exception and not at.error
    labels = [r.label for r in abl.view().runs]
    assert labels == ["PE, 4 heads", "no PE, 4 heads", "PE, 1 head"]
    assert all(r.spec.task == "increasing" and r.step == 8 for r in abl.view().runs)
    tables = " ".join(t.value.to_string() for t in at.table)
    assert "no PE, 4 heads" in tables and "PE, 1 head" in tables


def test_curves_keep_the_runs_order_for_their_colours():
    """Vega-Lite sorts a nominal colour field alphabetically unless told not to (sort: null), which
    gave one run two colours in the loss and the accuracy charts."""
    import pandas as pd

    from ui import charts

    runs = ["PE, 4 heads", "no PE, 4 heads", "PE, 1 head"]
    spec = charts.lines(pd.DataFrame({"step": [1, 1, 1], "loss": [1.0, 2.0, 3.0], "run": runs}), "step", "loss", "run")
    assert spec["encoding"]["color"]["sort"] is None
    assert [row["run"] for row in spec["data"]["values"]] == runs


def test_upload_without_recorded_settings_takes_them_from_the_page(at):
    cfg = encoder.EncoderConfig(n_layers=1, d_model=16, n_heads=2)
    buffer = io.BytesIO()
    encoder_io.save(encoder.init_params(cfg, seed=0), buffer)       # no cfg: weights only
    at.run()
    at.session_state["training.upload_bytes"] = buffer.getvalue()
    at.run()
    assert not at.exception and not at.error
    assert "does not record the number of heads" in texts(at.caption)
    assert trainer_of(at).view().runs[0].spec.n_heads == 4            # the page's setting


def test_a_compressed_bomb_is_refused_before_unpacking(at):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, embed=np.zeros((limits.MAX_UPLOAD_MB * 2 ** 18 + 1,), dtype=np.float32))
    assert len(buffer.getvalue()) < limits.MAX_UPLOAD_MB * 2 ** 20
    at.run()
    at.session_state["training.upload_bytes"] = buffer.getvalue()
    at.run()
    assert "once unpacked" in texts(at.error) and not at.exception
    assert trainer_of(at).view().runs == []


def test_a_failing_chart_is_a_message_not_a_traceback(at, monkeypatch):
    from ui import charts

    def broken(*args, **kwargs):
        raise RuntimeError("chart builder broke")

    monkeypatch.setattr(charts, "lines", broken)
    at.run()
    at.number_input(key="training.steps").set_value(5).run()
    button(at, "Start training").click().run()
    assert trainer_of(at).join(30)
    at.run()
    assert not at.exception
    assert "Could not draw the training view" in texts(at.error)


def test_sections_are_numbered_without_a_gap_before_and_after_a_run(at):
    at.run()
    numbered = [h.value.split(".")[0] for h in at.header if h.value[:1].isdigit()]
    assert numbered == ["1", "2", "3"]
    at.number_input(key="training.steps").set_value(3).run()
    button(at, "Start training").click().run()
    assert rerun_until(at, lambda a: trainer_of(a).status == "done", timeout=40)
    at.run()
    assert any(h.value == "Results" for h in at.subheader)
    assert [h.value.split(".")[0] for h in at.header if h.value[:1].isdigit()] == ["1", "2", "3"]


def test_a_time_cap_stops_the_ablations_at_one_step_and_the_table_says_so(at):
    at.session_state["training.ablation_trainer"] = Trainer(max_seconds=0.5)
    at.run()
    at.number_input(key="training.ablation_steps").set_value(limits.MAX_TRAIN_STEPS).run()
    button(at, "Run the ablations").click().run()
    abl = at.session_state["training.ablation_trainer"]
    assert rerun_until(at, lambda a: abl.status == "done", timeout=60)
    at.run()
    runs = abl.view().runs
    stopped = {r.step for r in runs}
    assert len(stopped) == 1
    step = stopped.pop()
    assert 0 < step < limits.MAX_TRAIN_STEPS
    cells = [c for t in at.table for c in t.value["steps"]]
    assert cells and all(c == f"{step} of {limits.MAX_TRAIN_STEPS} (stopped early: time cap)" for c in cells)
    assert any("stopped the runs at step" in w.value for w in at.warning)


def shown_source(at) -> str:
    """The code blocks of the training step's source expander."""
    box = opened_source(at, "Source: the")
    return box.label + " " + " ".join(c.value for c in box.code)


def test_the_step_switch_changes_the_source_and_the_milliseconds(at, compiled):
    """A run on each track: the page's ms-per-step metric names the track that ran and reads that
    run's time, and the source expander shows that track's functions."""
    at.run()
    at.number_input(key="training.steps").set_value(40)
    readings = {}
    for track in ("readable", "compiled"):
        at.radio(key="training.track").set_value(track)
        button(at, "Reset").click().run()
        button(at, "Start training").click().run()
        assert rerun_until(at, lambda a: not trainer_of(a).running and trainer_of(a).view().runs
                           and trainer_of(a).view().runs[0].step == 40, timeout=120)
        at.run()                           # draw the finished run
        metric = next(m for m in at.metric if m.label.startswith("ms per step"))
        assert metric.label == f"ms per step ({track} step)"
        run = trainer_of(at).view().runs[0]
        assert float(metric.value) == pytest.approx(run.last["ms_per_step"], abs=0.006)
        readings[track] = (float(metric.value), shown_source(at))
    (ms_r, src_r), (ms_c, src_c) = readings["readable"], readings["compiled"]
    assert "the readable training step" in src_r and "def backward(" in src_r and "def forward(" in src_r
    assert "def forward_checked(" in src_r              # what forward runs after its parameter check
    assert "the compiled training step" in src_c and "def encoder_layers_backward(" in src_c
    assert "def encoder_layers_backward(" not in src_r and "def block_backward(" not in src_c
    assert ms_r > ms_c                 # the readable step runs Python between its sublayers


# ----------------------------------------------------------------------------------------------
# the questions: the opening one locks the ablations; the answers are what the page's runs show
# ----------------------------------------------------------------------------------------------
def test_the_opening_question_locks_the_ablations_and_the_run_without_positions_can_only_guess():
    """Before the answer the ablations cannot run and the page does not say what happens without
    positions. After it, the ablation's model without positions gives every near miss of its
    validation set exactly its positive's prediction, so on those pairs it is right half the time
    (the answer: a coin toss), while the model with positions tells them apart."""
    at = page(answered=False)
    try:
        at.run()
        assert button(at, "Run the ablations").disabled
        assert "cannot see order" not in texts(at.markdown)
        answer_question(at, questions.NO_POSITIONS, questions.NO_POSITIONS.options[questions.NO_POSITIONS.answer])
        assert not button(at, "Run the ablations").disabled and "cannot see order" in texts(at.markdown)
        at.number_input(key="training.ablation_steps").set_value(8).run()
        button(at, "Run the ablations").click().run()
        ablation = at.session_state["training.ablation_trainer"]
        assert rerun_until(at, lambda a: ablation.status == "done", timeout=60)
        at.run()
        data = tasks.make_dataset("increasing", *SIZES, seed=0)
        negatives = data.X_val[data.y_val == 0]
        pairs = np.concatenate([np.sort(negatives, axis=1), negatives])         # each positive, then its near miss
        labels = np.r_[np.ones(len(negatives), int), np.zeros(len(negatives), int)]
        predicted = {}
        for index, label in ((0, "PE, 4 heads"), (1, "no PE, 4 heads")):
            params, cfg = ablation.params(index)
            assert ablation.view().runs[index].label == label
            logits, _ = transformer.forward(params, cfg, pairs)
            predicted[label] = logits
            shown = [t.value for t in at.table if label in list(t.value["run"])][0].set_index("run")
            val_logits, _ = transformer.forward(params, cfg, data.X_val)
            acc = np.mean(val_logits.argmax(axis=1) == data.y_val)
            assert shown.loc[label, "validation accuracy"] == f"{acc:.3f}"       # the page's number is this model's
        half = len(negatives)
        blind = predicted["no PE, 4 heads"]
        np.testing.assert_allclose(blind[:half], blind[half:], atol=1e-5)       # a near miss gets its positive's logits
        assert np.mean(blind.argmax(axis=1) == labels) == 0.5
        assert np.abs(predicted["PE, 4 heads"][:half] - predicted["PE, 4 heads"][half:]).max() > 1e-3
        assert questions.NO_POSITIONS.options[questions.NO_POSITIONS.answer].startswith("At a coin toss")
    finally:
        for key in ("training.trainer", "training.ablation_trainer"):
            if key in at.session_state:
                at.session_state[key].reset()


def test_the_loss_curve_starts_where_the_first_loss_question_says(at):
    """One step of the default model on 'sum': the loss of that first batch, before any update, is
    the question's answer within its tolerance (ln 2 too: the answer a student reasons to)."""
    at.run()
    at.number_input(key="training.steps").set_value(1)
    at.radio(key="training.track").set_value("readable")
    at.run()
    button(at, "Start training").click().run()
    assert rerun_until(at, lambda a: trainer_of(a).status == "done", timeout=120)
    at.run()
    first = trainer_of(at).view().runs[0].metrics[0]["loss"]
    assert [m.value for m in at.metric if m.label == "Loss (last batch)"] == [f"{first:.4f}"]
    p = questions.FIRST_LOSS
    assert abs(first - p.answer) <= p.tolerance * p.answer
    assert abs(np.log(2) - p.answer) <= p.tolerance * p.answer
