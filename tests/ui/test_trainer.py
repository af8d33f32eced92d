"""The background trainer behind the training page, driven as a plain object (no Streamlit)."""
import threading
import time

import numpy as np
import pytest

from core import encoder, limits
from core.model import encoder_io
from core.model.config import param_shapes
from ui import background_run
from ui import trainer as trainer_module
from core.training.encoder_runs import EncoderRun
from ui.background_run import BUSY, COMPILING, DONE, ERROR, IDLE, LOADED, PAUSED, QUEUED, RUNNING
from ui.trainer import Trainer

TINY = dict(task="sum", n_layers=1, d_model=16, n_heads=2, n_train=200, n_val=40, n_test=40, eval_every=5)


def tiny(**overrides) -> EncoderRun:
    return EncoderRun(**{**TINY, **overrides})


def workers_alive() -> list:
    return [t for t in threading.enumerate() if t.name == "encoder-trainer" and t.is_alive()]


@pytest.fixture(scope="module", autouse=True)
def compiled_encoder():
    """Compile (or load from the cache) the encoder's step once, before any test waits on a clock:
    from an empty Numba cache that takes longer than the waits below."""
    encoder.warm_up(tiny().config())


@pytest.fixture
def trainer():
    t = Trainer(snapshot_every=5)
    yield t
    t.reset()
    assert t.join(10)


def wait_for(predicate, timeout=300.0):
    """Poll ``predicate`` until it holds; the limit only guards against a hang (a busy machine is slow,
    not wrong), so it is generous."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_start_runs_to_the_step_count_and_the_thread_ends(trainer):
    trainer.start(tiny(steps=30))
    assert trainer.status in (*BUSY, DONE)
    assert trainer.join(300), "the 30-step run's worker did not end"
    view = trainer.view()
    assert view.status == DONE and not workers_alive()
    run = view.runs[0]
    assert run.finished and run.step == 30 and "step count" in run.stop_reason
    assert [m["step"] for m in run.metrics] == list(range(1, 31))
    assert run.metrics[-1]["val_acc"] is not None and run.metrics[-1]["evaluated"]
    assert all(np.isfinite(m["loss"]) and m["steps_per_s"] >= 0 for m in run.metrics)
    elapsed = [m["elapsed"] for m in run.metrics]
    assert elapsed == sorted(elapsed)
    # the end: test accuracy and a confusion table over the whole test split
    assert 0.0 <= run.test_acc <= 1.0
    assert run.confusion.shape == (2, 2) and run.confusion.sum() == 40
    assert np.isclose(np.trace(run.confusion) / 40, run.test_acc)
    # attention maps of every layer and head for the chosen example, rows summing to 1
    assert run.attention.shape == (1, 2, 16, 16) and run.attention_step == 30
    np.testing.assert_allclose(run.attention.sum(axis=-1), 1.0, atol=1e-5)


def test_metrics_grow_while_it_trains(trainer):
    trainer.start(tiny(steps=400))
    assert wait_for(lambda: len(trainer.view().runs[0].metrics) >= 3)
    first = len(trainer.view().runs[0].metrics)
    assert wait_for(lambda: len(trainer.view().runs[0].metrics) > first or not trainer.running)
    trainer.pause()
    assert trainer.status == PAUSED


def test_pause_and_resume_give_the_same_model_as_a_straight_run(trainer):
    straight = Trainer()
    straight.start(tiny(steps=40))
    assert straight.join(30)
    expected, _ = straight.params()

    def unhurried(state, data, **kw):         # the default loop, 20 ms a step: the pause lands part-way
        for event in trainer_module.encoder_runs.train(state, data, **kw):
            time.sleep(0.02)
            yield event

    trainer.start(tiny(steps=40), train=unhurried)
    assert wait_for(lambda: trainer.view().runs[0].step >= 5)
    trainer.pause()
    view = trainer.view()
    assert view.status == PAUSED and not workers_alive()
    paused_at = view.runs[0].step
    assert 5 <= paused_at < 40, "the run should pause part-way"
    assert view.runs[0].test_acc is not None          # evaluated where it paused
    time.sleep(0.1)
    assert trainer.view().runs[0].step == paused_at    # nothing trains while paused
    trainer.resume()
    assert trainer.join(30) and trainer.status == DONE
    got, _ = trainer.params()
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    steps = [m["step"] for m in trainer.view().runs[0].metrics]
    assert steps == list(range(1, 41))


def test_a_resumed_run_keeps_the_training_loop_it_started_with(trainer):
    calls = []

    def counted(state, data, **kw):           # the default loop, counting the calls
        calls.append(state.step)
        yield from trainer_module.encoder_runs.train(state, data, **kw)

    trainer.start(tiny(steps=400), train=counted)
    assert wait_for(lambda: trainer.view().runs[0].step >= 5)
    trainer.pause()
    paused_at = trainer.view().runs[0].step
    trainer.resume()
    assert wait_for(lambda: trainer.view().runs[0].step > paused_at)
    trainer.pause()
    assert calls[0] == 0 and calls[-1] == paused_at


def test_same_seed_same_final_state_and_another_seed_differs():
    finals = []
    for seed in (3, 3, 4):
        t = Trainer()
        t.start(tiny(steps=15, seed=seed))
        assert t.join(30)
        finals.append(t.params()[0])
    for name in finals[0]:
        np.testing.assert_array_equal(finals[0][name], finals[1][name])
    assert not np.array_equal(finals[0]["embed"], finals[2]["embed"])


def test_steps_are_capped():
    t = Trainer(max_steps=7)
    t.start(tiny(steps=50))
    assert t.join(30)
    run = t.view().runs[0]
    assert run.step == 7 and run.target_steps == 7
    with pytest.raises(ValueError, match=str(limits.MAX_TRAIN_STEPS)):
        Trainer().start(tiny(steps=limits.MAX_TRAIN_STEPS + 1))


def test_seconds_are_capped():
    t = Trainer(max_seconds=0.3)
    started = time.monotonic()
    t.start(tiny(steps=limits.MAX_TRAIN_STEPS))
    assert t.join(30)
    assert time.monotonic() - started < 10
    run = t.view().runs[0]
    assert t.status == DONE and run.step < limits.MAX_TRAIN_STEPS
    assert "time cap" in run.stop_reason
    assert run.metrics[-1]["val_acc"] is not None and run.test_acc is not None
    assert run.metrics[-1]["elapsed"] < 0.3 + 1.0


def test_reset_stops_and_forgets(trainer):
    trainer.start(tiny(steps=limits.MAX_TRAIN_STEPS))
    assert wait_for(lambda: len(trainer.view().runs[0].metrics) > 0)
    trainer.reset()
    assert trainer.join(10) and not workers_alive()
    view = trainer.view()
    assert view.status == IDLE and view.runs == []
    with pytest.raises(ValueError, match="no model"):
        trainer.params()
    with pytest.raises(ValueError, match="Nothing to resume"):
        trainer.resume()


def test_bad_specs_are_refused_and_change_nothing(trainer):
    trainer.start(tiny(steps=5))
    assert trainer.join(30)
    before = trainer.view()
    with pytest.raises(ValueError, match="cannot be split evenly"):
        trainer.start(tiny(d_model=16, n_heads=3))
    with pytest.raises(ValueError, match="Layers"):
        trainer.start(tiny(n_layers=limits.MAX_TRAIN_LAYERS + 1))
    with pytest.raises(ValueError, match="d_model"):
        trainer.start(tiny(d_model=limits.MAX_TRAIN_D_MODEL + 8, n_heads=1))
    with pytest.raises(ValueError, match="learning rate"):
        trainer.start(tiny(lr=0.0))
    with pytest.raises(ValueError, match="Unknown task"):
        trainer.start(tiny(task="sort"))
    after = trainer.view()
    assert after.status == DONE and after.version == before.version and after.runs[0].step == 5


def test_an_ablation_runs_its_specs_one_after_the_other(trainer):
    specs = [tiny(task="increasing", steps=12, label="with PE"),
             tiny(task="increasing", steps=12, positional="none", label="no PE"),
             tiny(task="increasing", steps=12, n_heads=1, label="1 head")]
    trainer.start(specs)
    assert trainer.join(60) and trainer.status == DONE
    runs = trainer.view().runs
    assert [r.label for r in runs] == ["with PE", "no PE", "1 head"]
    assert all(r.finished and r.step == 12 and r.test_acc is not None for r in runs)
    assert runs[2].attention.shape == (1, 1, 8, 8)
    # the runs share one data set, so the chosen example is the same sequence in each
    np.testing.assert_array_equal(runs[0].example_tokens, runs[1].example_tokens)


def test_the_time_cap_is_shared_between_ablation_runs():
    t = Trainer(max_seconds=0.4)
    t.start([tiny(steps=limits.MAX_TRAIN_STEPS, label="a"), tiny(steps=limits.MAX_TRAIN_STEPS, label="b")])
    assert t.join(30)
    runs = t.view().runs
    assert all(r.finished and "time cap" in r.stop_reason for r in runs)
    assert all(r.metrics[-1]["elapsed"] < 0.2 + 1.0 for r in runs)


def test_choosing_an_example_refreshes_the_attention_maps(trainer):
    trainer.start(tiny(steps=10))
    assert trainer.join(30)
    first = trainer.view().runs[0]
    trainer.set_example(7)
    second = trainer.view().runs[0]
    assert trainer.view().example_index == 7
    assert not np.array_equal(first.example_tokens, second.example_tokens)
    assert not np.allclose(first.attention, second.attention)
    trainer.set_example(10_000)              # clipped to the validation set
    assert trainer.view().example_index == 39


def test_weights_download_and_upload_round_trip(trainer):
    trainer.start(tiny(steps=20, positional="learned"))
    assert trainer.join(30)
    trained = trainer.view().runs[0]
    raw = trainer.weights_npz()
    params, cfg = trainer.params()
    loaded = encoder_io.load(raw, cfg)
    assert set(loaded) == set(param_shapes(cfg)) and "pos" in loaded
    other = Trainer()
    other.load(loaded, cfg, tiny())
    view = other.view()
    assert view.status == LOADED and view.runs[0].test_acc == trained.test_acc
    np.testing.assert_allclose(view.runs[0].attention, trained.attention, atol=1e-6)
    other.resume()                            # an uploaded model can train further
    assert other.join(30) and other.status == DONE


def test_a_full_server_queues_runs_first_come_first_served_and_shows_each_its_place(monkeypatch):
    """One slot: the first run trains; two more wait, each told its place; they train in the order
    they came, each at its own pace once started; a run paused while it waits leaves the queue."""
    monkeypatch.setattr(background_run, "QUEUE", background_run.TrainingQueue(1))
    gate, began = threading.Event(), []

    def train_as(name, hold=False):
        def train(state, data, **kw):
            if not began or began[-1] != name:
                began.append(name)
            if hold:
                gate.wait(30)
            yield from trainer_module.encoder_runs.train(state, data, **kw)
        return train

    first, second, third, fourth = (Trainer(snapshot_every=5) for _ in range(4))
    first.start(tiny(steps=3), train=train_as("first", hold=True))
    assert wait_for(lambda: first.status == RUNNING)
    second.start(tiny(steps=3), train=train_as("second"))
    assert wait_for(lambda: "place 1 in the queue" in second.view().message)
    third.start(tiny(steps=3), train=train_as("third"))
    fourth.start(tiny(steps=3), train=train_as("fourth"))
    assert wait_for(lambda: "place 2 in the queue" in third.view().message)
    assert wait_for(lambda: "place 3 in the queue" in fourth.view().message)
    assert second.status == third.status == QUEUED and second.running and second.view().runs[0].step == 0
    assert "1 runs are training" in third.view().message
    fourth.pause()                                          # changed their mind: out of the queue
    assert fourth.status == PAUSED and fourth.view().runs[0].step == 0
    gate.set()
    for t in (first, second, third):
        assert t.join(60) and t.status == DONE
    assert began == ["first", "second", "third"]
    assert background_run.QUEUE.counts() == (0, 0)          # every slot given back
    fourth.resume()                                         # and it can still train
    assert fourth.join(60) and fourth.status == DONE


def test_an_error_in_the_worker_is_reported_not_raised(trainer):
    def broken(*args, **kwargs):
        raise FloatingPointError("the loss became NaN")
        yield  # pragma: no cover

    trainer.start(tiny(steps=5), train=broken)   # the training loop is the caller's choice
    assert trainer.join(10)
    view = trainer.view()
    assert view.status == ERROR and "NaN" in view.message and not workers_alive()
    # the slot came back: a fresh run can start, with the default loop
    trainer.start(tiny(steps=3))
    assert trainer.join(30) and trainer.status == DONE


def test_a_time_cap_stops_every_ablation_run_at_the_same_step():
    """Runs of unequal speed (4 heads vs 1, on a busy server) still compare equal training: they
    train in turns, so the shared cap leaves them at one step count, and each says it stopped early."""
    slow = trainer_module.encoder_runs.train

    def uneven(state, data, **kw):          # the first run's steps take far longer than the others'
        for m in slow(state, data, **kw):
            if state.cfg.n_heads == 2:
                time.sleep(0.01)
            yield m

    t = Trainer(max_seconds=0.6)
    t.start([tiny(steps=limits.MAX_TRAIN_STEPS, label="slow"), tiny(steps=limits.MAX_TRAIN_STEPS, n_heads=1,
                                                                    label="fast"),
             tiny(steps=limits.MAX_TRAIN_STEPS, positional="none", n_heads=1, label="fast too")], train=uneven)
    assert t.join(30) and t.status == DONE
    runs = t.view().runs
    steps = {r.step for r in runs}
    assert len(steps) == 1 and 0 < steps.pop() < limits.MAX_TRAIN_STEPS
    assert all(r.finished and "time cap" in r.stop_reason and f"step {r.step} of" in r.stop_reason for r in runs)
    assert all(r.metrics[-1]["evaluated"] and r.test_acc is not None for r in runs)


def test_a_run_that_waits_on_the_compiled_step_says_so(trainer, monkeypatch):
    """While the first step waits for Numba (loading, or compiling on first use) the status is
    ``compiling`` with what it prepares, not "running: step 0"; then it trains as usual."""
    gate, entered = threading.Event(), threading.Event()
    real_warm_up = trainer_module.classifier.warm_up

    def slow_warm_up(*args, **kwargs):
        entered.set()
        assert gate.wait(300), "the test never released the compile"
        return real_warm_up(*args, **kwargs)

    monkeypatch.setattr(trainer_module.classifier, "warm_up", slow_warm_up)
    trainer.start(tiny(steps=3))
    assert entered.wait(300), "the worker never reached the compiled step"
    view = trainer.view()
    assert view.status == COMPILING and trainer.running
    assert "compiled training step" in view.message and "first use" in view.message
    with pytest.raises(ValueError):                 # busy: a second start is refused meanwhile
        trainer.start(tiny(steps=3))
    gate.set()
    assert trainer.join(300), "the run did not end after its compile"
    assert trainer.view().status == DONE and trainer.view().runs[0].step == 3


def test_the_decoder_trainer_says_when_it_waits_on_the_compiled_step(monkeypatch):
    from core.training.decoder_runs import build
    from ui import decoder_trainer

    gate, entered = threading.Event(), threading.Event()

    def slow_warm_up(*args, **kwargs):
        entered.set()
        assert gate.wait(300), "the test never released the compile"

    monkeypatch.setattr(decoder_trainer.decoder_loss, "warm_up", slow_warm_up)
    monkeypatch.setattr(decoder_trainer.warmup, "track", lambda label: "compiled")
    def fit(setup, *, steps, callback, track, **_):     # the loop itself is not what is tested here
        assert track == "compiled"
        for step in range(steps):
            callback(step, 1.0)
        return decoder_trainer._untrained(setup), [1.0] * steps

    trainer = decoder_trainer.DecoderTrainer()
    trainer.start(build("reverse"), 2, track="compiled", fit=fit)
    assert entered.wait(300), "the worker never reached the compiled step"
    view = trainer.view()
    assert view.status == COMPILING and view.running and "compiled training step" in view.message
    gate.set()
    assert trainer.join(300), "the run did not end after its compile"
    assert trainer.view().status == DONE


@pytest.mark.parametrize("place, slots, cap, longest", [(1, 2, 60, 60), (2, 2, 60, 60), (3, 2, 60, 120),
                                                         (5, 1, 30, 150)])
def test_a_queued_run_is_told_its_place_and_its_longest_wait(place, slots, cap, longest):
    message = background_run.queue_message(place, slots, slots, cap)
    assert f"place {place} in the queue" in message
    assert f"at most about {longest} s" in message and f"at most {cap} s" in message


# ----------------------------------------------------------------------------------------------
# a reset (or a new start) leaves the old worker nowhere to write
# ----------------------------------------------------------------------------------------------
def held_encoder_loop(reached: threading.Event, release: threading.Event, tag: str):
    """The default training loop, every step it reports marked ``tag`` (in its ``track``), held
    before its third step until ``release`` is set (``reached`` says it got there)."""
    def train(state, data, **kw):
        for m in trainer_module.encoder_runs.train(state, data, **kw):
            if m["step"] == 3:
                reached.set()
                assert release.wait(300), "the test never released the held run"
            yield {**m, "track": tag}
    return train


def tagged_encoder_loop(tag: str):
    """The default training loop, every step it reports marked ``tag``."""
    def train(state, data, **kw):
        for m in trainer_module.encoder_runs.train(state, data, **kw):
            yield {**m, "track": tag}
    return train


def start_in_thread(start, *args, **kwargs) -> threading.Thread:
    """``start(*args, **kwargs)`` in a thread of its own (a start waits for a stale worker to end)."""
    thread = threading.Thread(target=start, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("then", ["reset", "reset and start anew while it is held"])
def test_an_encoder_run_s_old_worker_writes_nowhere_after_a_reset(trainer, then):
    """A reset while the worker is inside a step: when that step ends, the worker's metric,
    attention snapshot, evaluation, weights and status land nowhere the page reads; a new run shows
    its own steps only, from step 1 (read while it is held in its third step, and at its end), and
    ends with the weights a run of its own alone ends with."""
    straight = Trainer()
    straight.start(tiny(steps=4, seed=1), train=tagged_encoder_loop("new run"))
    assert straight.join(300), "the straight 4-step run did not end"
    expected, _ = straight.params()
    reached, release = threading.Event(), threading.Event()
    new_reached, new_release = threading.Event(), threading.Event()
    new_loop = held_encoder_loop(new_reached, new_release, "new run")
    try:
        trainer.start(tiny(steps=50), train=held_encoder_loop(reached, release, "old run"))
        assert reached.wait(300), "the run never reached its third step"
        held = trainer.view()
        assert [m["step"] for m in held.runs[0].metrics] == [1, 2] and held.status == RUNNING
        trainer.reset(timeout=0.01)                 # the worker is held: the reset cannot wait for it
        assert workers_alive(), "the held worker should outlive the reset"
        cleared = trainer.view()
        assert cleared.status == IDLE and cleared.runs == [] and cleared.version > held.version
        starter = None
        if then != "reset":
            starter = start_in_thread(trainer.start, tiny(steps=4, seed=1), train=new_loop)
            starter.join(0.5)
            assert starter.is_alive(), "a new start must wait for the old worker to end"
            assert trainer.view().runs == []
        release.set()
        if starter is None:
            assert trainer.join(300), "the old worker did not end once released"
            after = trainer.view()
            assert (after.status, after.message, after.runs) == (IDLE, "", []), after
            assert after.version >= cleared.version
            with pytest.raises(ValueError, match="no model"):
                trainer.params()
            trainer.start(tiny(steps=4, seed=1), train=new_loop)
        else:
            starter.join(300)
            assert not starter.is_alive(), "the new start did not return once the old worker ended"
        assert new_reached.wait(300), "the new run never reached its third step"
        during = trainer.view()
        assert during.status == RUNNING and during.message == "" and len(during.runs) == 1
        assert [(m["step"], m["track"]) for m in during.runs[0].metrics] == [(1, "new run"), (2, "new run")]
    finally:
        release.set()
        new_release.set()
    assert trainer.join(300), "the new 4-step run did not end"
    view = trainer.view()
    assert view.status == DONE and view.message == "" and len(view.runs) == 1 and not workers_alive()
    run = view.runs[0]
    assert run.spec.seed == 1 and run.step == 4 and run.finished
    assert [m["step"] for m in run.metrics] == [1, 2, 3, 4]
    assert {m["track"] for m in run.metrics} == {"new run"}, "the old worker's metrics reached the new run"
    assert run.attention_step == 4 and view.version > during.version > cleared.version
    got, _ = trainer.params()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def held_decoder_fit(reached: threading.Event, release: threading.Event, params: dict):
    """A decoder loop whose every step is an evaluation point and reports a loss of 1000 + step
    (no real run reaches it), returning ``params``; held before its third step until ``release``."""
    def fit(setup, *, steps, callback, on_params, **_):
        for step in range(steps):
            if step == 2:
                reached.set()
                assert release.wait(300), "the test never released the held run"
            on_params(step, params)
            if callback(step, 1000.0 + step):
                break
        return params, []
    return fit


def held_real_decoder_fit(reached: threading.Event, release: threading.Event):
    """:func:`core.training.decoder_runs.fit`, held before its third step until ``release``."""
    from core.training import decoder_runs

    def fit(setup, *, callback, **kw):
        def held(step, loss):
            if step == 2:
                reached.set()
                assert release.wait(300), "the test never released the held run"
            return callback(step, loss)
        return decoder_runs.fit(setup, callback=held, **kw)
    return fit


@pytest.mark.parametrize("then", ["reset", "reset and start anew while it is held"])
def test_a_decoder_run_s_old_worker_writes_nowhere_after_a_reset(then):
    """The decoder's worker, held inside its third step while the run is reset: its metric, its
    evaluation, its trained weights and its status all land nowhere; the model shown stays the
    untrained one while the new run trains (read while it is held in its third step), and then it
    is the new run's, under a new version."""
    from core.model import decoder
    from core.training.decoder_runs import build
    from ui import decoder_trainer

    setup = build("reverse")
    stale = decoder.init_params(setup.cfg, seed=123)            # weights no real run here ends with
    trainer = decoder_trainer.DecoderTrainer()
    reached, release = threading.Event(), threading.Event()
    new_reached, new_release = threading.Event(), threading.Event()
    new_fit = held_real_decoder_fit(new_reached, new_release)
    try:
        trainer.start(setup, 50, fit=held_decoder_fit(reached, release, stale), track="readable")
        assert reached.wait(300), "the run never reached its third step"
        held = trainer.view()
        assert [m["step"] for m in held.metrics] == [1, 2] and held.status == RUNNING
        trainer.reset(timeout=0.01)                 # the worker is held: the reset cannot wait for it
        cleared = trainer.view()
        assert (cleared.status, cleared.metrics, cleared.evals, cleared.task) == (IDLE, [], [], "")
        assert cleared.version > held.version
        untrained, version, trained = trainer.model(setup)
        assert version == -1 and not trained
        starter = None
        if then != "reset":
            starter = start_in_thread(trainer.start, setup, 3, fit=new_fit, track="readable")
            starter.join(0.5)
            assert starter.is_alive(), "a new start must wait for the old worker to end"
        release.set()
        if starter is None:
            assert trainer.join(300), "the old worker did not end once released"
            assert trainer.view() == cleared, "the old worker changed the record after the reset"
            assert trainer.model(setup)[1:] == (-1, False), "the old worker's weights became the model"
            trainer.start(setup, 3, fit=new_fit, track="readable")
        else:
            starter.join(300)
            assert not starter.is_alive(), "the new start did not return once the old worker ended"
        assert new_reached.wait(300), "the new run never reached its third step"
        during = trainer.view()
        assert during.status == RUNNING and during.message == "" and during.task == "reverse"
        assert [m["step"] for m in during.metrics] == [1, 2] and all(m["loss"] < 1000 for m in during.metrics)
        assert [e["step"] for e in during.evals] == [0]
        shown, version, trained = trainer.model(setup)
        still_untrained = shown is untrained
        assert still_untrained and (version, trained) == (-1, False), "a model is shown before the new run ends"
    finally:
        release.set()
        new_release.set()
    try:
        assert trainer.join(300), "the new 3-step run did not end"
        view = trainer.view()
        assert view.status == DONE and view.message == "Trained all 3 steps." and view.task == "reverse"
        assert [m["step"] for m in view.metrics] == [1, 2, 3]
        assert all(m["loss"] < 1000 for m in view.metrics), "the old worker's metrics reached the new run"
        assert [e["step"] for e in view.evals] == [0, 3], "the old worker's evaluations reached the new run"
        assert view.version > during.version > cleared.version
        params, version, trained = trainer.model(setup)
        assert trained and version > 0 and params is not stale and params is not untrained
        assert any(not np.array_equal(params[name], stale[name]) for name in stale)
    finally:
        trainer.reset()
        assert trainer.join(300)


def test_the_untrained_decoder_every_session_shares_cannot_be_edited_in_place():
    from core.training.decoder_runs import build
    from ui import decoder_trainer

    params, version, trained = decoder_trainer.DecoderTrainer().model(build("reverse"))
    assert not trained and version == -1
    for name, array in params.items():
        with pytest.raises(ValueError):
            array[...] = 0      # another student's page reads the same arrays
