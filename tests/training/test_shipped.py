"""The default models shipped with the app (core.training.shipped): they record today's default runs,
training those runs again gives them back, and only exactly those runs read them."""
import dataclasses

import numpy as np
import pytest

from core.lessons import inside
from core.training import induction, shipped
from core.training.encoder_runs import EncoderRun

# Training again gives the shipped models bit for bit on the machine that wrote them. A CPU with
# other SIMD widths rounds a few sums differently, and 300-1,200 float32 Adam steps grow that: on
# AVX2 against these AVX-512 files, the encoder's test logits moved by 0.06 at most (the learning
# rate 5 % higher moves them by 0.25), the induction model's losses by 5e-6.
LOGITS_ATOL, LOSSES_ATOL = 0.15, 1e-3


def test_the_shipped_encoder_is_the_default_run_trained_again():
    params, run = shipped.load(f"{shipped.FOLDER}/{shipped.ENCODER_FILE}")
    assert run["settings"] == dataclasses.asdict(EncoderRun()), "the defaults changed: python -m core.training.shipped"
    assert run["track"] == "compiled"
    again = inside.train_default("sum", 0, track="compiled")
    loaded = inside.default_model("sum", 0)
    assert loaded.origin.endswith("trained on the compiled training step and shipped with the app")
    assert sorted(loaded.params) == sorted(again.params) == sorted(params)
    X, y = loaded.data.X_test, loaded.data.y_test
    shipped_logits, again_logits = (inside.forward(m.params, m.cfg, X)[0] for m in (loaded, again))
    np.testing.assert_allclose(shipped_logits, again_logits, atol=LOGITS_ATOL)
    shipped_acc, again_acc = inside.accuracy(shipped_logits, y), inside.accuracy(again_logits, y)
    assert shipped_acc > 0.9 and abs(shipped_acc - again_acc) <= 0.01


def test_the_shipped_induction_model_is_the_default_run_trained_again():
    params, run = shipped.load(f"{shipped.FOLDER}/{shipped.INDUCTION_FILE}")
    setup = induction.InductionSetup()
    assert run["settings"] == {**dataclasses.asdict(setup), "seed": 0}, "the defaults changed: python -m core.training.shipped"
    again = induction.train_induction(setup, seed=0, track="compiled")
    assert sorted(params) == sorted(again.params)
    np.testing.assert_allclose(run["losses"], again.losses, atol=LOSSES_ATOL)
    loaded = induction.default_run(setup, seed=0)
    assert loaded.shipped and loaded.track == "compiled" and loaded.losses == run["losses"]
    data = induction.held_out(setup, 0)
    a, b = induction.measure(loaded.params, loaded.cfg, data), induction.measure(again.params, again.cfg, data)
    assert a.acc_repeated_segment > 0.9 and abs(a.acc_repeated_segment - b.acc_repeated_segment) <= 0.02
    assert induction.best_heads(a) == induction.best_heads(b)


@pytest.mark.parametrize("change", [dict(seed=1), dict(steps=40), dict(task="repeat")])
def test_any_other_encoder_run_trains(change, monkeypatch):
    trained = []
    monkeypatch.setattr(inside, "train_default", lambda *a, **kw: trained.append((a, kw)) or "trained")
    settings = dict(task="sum", seed=0, steps=None) | change
    assert inside.default_model(settings["task"], settings["seed"], steps=settings["steps"]) == "trained"
    assert len(trained) == 1


def test_any_other_induction_run_trains(monkeypatch):
    monkeypatch.setattr(induction, "train_induction", lambda setup, seed, track: ("trained", setup.steps, seed))
    assert induction.default_run(induction.InductionSetup(), seed=1) == ("trained", induction.InductionSetup().steps, 1)
    assert induction.default_run(induction.InductionSetup(steps=100), seed=0) == ("trained", 100, 0)


def test_a_loaded_model_does_not_change_the_file():
    a = inside.default_model("sum", 0)
    for value in a.params.values():
        value[...] = 0                                       # a session editing its copy
    b = inside.default_model("sum", 0)
    assert all(np.any(value != 0) for value in b.params.values())


def test_both_pages_open_on_the_shipped_models_without_training(monkeypatch):
    """Opened with their defaults, neither page trains: each reads its shipped model and says so."""
    from streamlit.testing.v1 import AppTest

    def no_training(*args, **kwargs):
        raise AssertionError("a default page trained instead of reading its shipped model")

    monkeypatch.setattr(inside, "train_default", no_training)
    monkeypatch.setattr(induction, "train_induction", no_training)
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120).run()
    assert not at.exception
    caption = next(c.value for c in at.caption if c.value.startswith("Using the default model"))
    assert "shipped with the app" in caption
    at = AppTest.from_file("../../views/induction.py", default_timeout=120).run()
    assert not at.exception
    metric = next(m for m in at.metric if m.label.startswith("training"))
    assert metric.label == "training (compiled step, shipped)"
    assert metric.value == f"{shipped.load(f'{shipped.FOLDER}/{shipped.INDUCTION_FILE}')[1]['train_seconds']:.1f} s"
