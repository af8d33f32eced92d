"""The default models shipped with the app (core.training.shipped): the files' format, and that only
exactly the runs they record read them; every other run trains. Training them again gives them back:
tests/training/test_retrain_shipped.py."""
import numpy as np
import pytest

from core.training import encoder_runs, induction_runs, shipped


def test_a_file_is_read_for_exactly_the_settings_it_records(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "FOLDER", str(tmp_path))
    params = {"blocks.0.attn.W_Q": np.arange(6, dtype=np.float32).reshape(2, 3)}
    shipped.save(str(tmp_path / "m.npz"), params, {"settings": {"seed": 0, "steps": 10}, "track": "compiled"})
    read, run = shipped.load(str(tmp_path / "m.npz"))
    assert run == {"settings": {"seed": 0, "steps": 10}, "track": "compiled"}
    assert read.keys() == params.keys() and read["blocks.0.attn.W_Q"].dtype == np.float32
    np.testing.assert_array_equal(read["blocks.0.attn.W_Q"], params["blocks.0.attn.W_Q"])

    def load_or_train(name, settings):
        return shipped.load_or_train(name, settings, read=lambda p, r: ("read", r["track"]), train=lambda: "trained")

    assert load_or_train("m.npz", {"seed": 0, "steps": 10}) == ("read", "compiled")
    assert load_or_train("m.npz", {"seed": 1, "steps": 10}) == "trained"
    assert load_or_train("m.npz", {"seed": 0}) == "trained"
    assert load_or_train("other.npz", {"seed": 0, "steps": 10}) == "trained"


@pytest.mark.parametrize("change", [dict(seed=1), dict(steps=40), dict(task="repeat")])
def test_any_other_encoder_run_trains(change, monkeypatch):
    trained = []
    monkeypatch.setattr(encoder_runs, "train_default", lambda *a, **kw: trained.append((a, kw)) or "trained")
    settings = dict(task="sum", seed=0, steps=None) | change
    assert encoder_runs.default_model(settings["task"], settings["seed"], steps=settings["steps"]) == "trained"
    assert len(trained) == 1


def test_any_other_induction_run_trains(monkeypatch):
    monkeypatch.setattr(induction_runs, "train_induction", lambda setup, seed, track: ("trained", setup.steps, seed))
    setup = induction_runs.InductionSetup()
    assert induction_runs.default_run(setup, seed=1) == ("trained", setup.steps, 1)
    assert induction_runs.default_run(induction_runs.InductionSetup(steps=100), seed=0) == ("trained", 100, 0)


def test_the_default_runs_read_their_files(monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a default run trained instead of reading its shipped model")

    monkeypatch.setattr(encoder_runs, "train_default", no_training)
    monkeypatch.setattr(induction_runs, "train_induction", no_training)
    model = encoder_runs.default_model("sum", 0)
    assert model.origin.endswith("trained on the compiled training step and shipped with the app")
    run = induction_runs.default_run(induction_runs.InductionSetup(), seed=0)
    assert run.shipped and run.track == "compiled"
    assert run.losses == shipped.load(f"{shipped.FOLDER}/{shipped.INDUCTION_FILE}")[1]["losses"]


def test_a_loaded_model_does_not_change_the_file():
    a = encoder_runs.default_model("sum", 0)
    for value in a.params.values():
        value[...] = 0                                       # a session editing its copy
    b = encoder_runs.default_model("sum", 0)
    assert all(np.any(value != 0) for value in b.params.values())


def test_both_pages_open_on_the_shipped_models_without_training(monkeypatch):
    """Opened with their defaults, neither page trains: each reads its shipped model and says so."""
    from streamlit.testing.v1 import AppTest

    def no_training(*args, **kwargs):
        raise AssertionError("a default page trained instead of reading its shipped model")

    monkeypatch.setattr(encoder_runs, "train_default", no_training)
    monkeypatch.setattr(induction_runs, "train_induction", no_training)
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120).run()
    assert not at.exception
    caption = next(c.value for c in at.caption if c.value.startswith("Using the default model"))
    assert "shipped with the app" in caption
    at = AppTest.from_file("../../views/induction.py", default_timeout=120).run()
    assert not at.exception
    metric = next(m for m in at.metric if m.label.startswith("training"))
    assert metric.label == "training (compiled step, shipped)"
    assert metric.value == f"{shipped.load(f'{shipped.FOLDER}/{shipped.INDUCTION_FILE}')[1]['train_seconds']:.1f} s"
