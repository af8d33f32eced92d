"""Training the shipped models again (``python -m core.training.retrain_shipped``) gives back the
files shipped with the app: today's default runs, the same parameters, the same measures."""
import dataclasses

import numpy as np
import pytest

from core.lessons import induction, inside
from core.training import retrain_shipped, shipped
from core.training.encoder_runs import EncoderRun

# Training again gives the shipped models bit for bit on the machine that wrote them. A CPU with
# other SIMD widths rounds a few sums differently, and 300-1,200 float32 Adam steps grow that: on
# AVX2 against these AVX-512 files, the encoder's test logits moved by 0.06 at most (the learning
# rate 5 % higher moves them by 0.25), the induction model's losses by 5e-6.
LOGITS_ATOL, LOSSES_ATOL = 0.15, 1e-3
AGAIN = "the defaults changed: python -m core.training.retrain_shipped"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Both files written again, into a folder of their own."""
    folder = tmp_path_factory.mktemp("shipped")
    retrain_shipped.write(folder=str(folder))
    return lambda name: shipped.load(str(folder / name))


def test_the_shipped_encoder_is_the_default_run_trained_again(written):
    params, run = shipped.load(f"{shipped.FOLDER}/{shipped.ENCODER_FILE}")
    assert run["settings"] == dataclasses.asdict(EncoderRun()), AGAIN
    again, again_run = written(shipped.ENCODER_FILE)
    assert again_run == run == {"settings": run["settings"], "track": "compiled"}
    assert sorted(again) == sorted(params)
    model = inside.default_model("sum", 0)                            # the shipped one, as the page reads it
    X, y = model.data.X_test, model.data.y_test
    shipped_logits, again_logits = (inside.forward(p, model.cfg, X)[0] for p in (params, again))
    np.testing.assert_allclose(shipped_logits, again_logits, atol=LOGITS_ATOL)
    shipped_acc, again_acc = inside.accuracy(shipped_logits, y), inside.accuracy(again_logits, y)
    assert shipped_acc > 0.9 and abs(shipped_acc - again_acc) <= 0.01


def test_the_shipped_induction_model_is_the_default_run_trained_again(written):
    params, run = shipped.load(f"{shipped.FOLDER}/{shipped.INDUCTION_FILE}")
    setup = induction.InductionSetup()
    assert run["settings"] == {**dataclasses.asdict(setup), "seed": 0}, AGAIN
    again, again_run = written(shipped.INDUCTION_FILE)
    assert again_run["settings"] == run["settings"] and again_run["track"] == run["track"] == "compiled"
    assert sorted(again) == sorted(params)
    np.testing.assert_allclose(run["losses"], again_run["losses"], atol=LOSSES_ATOL)
    data = induction.held_out(setup, 0)
    a, b = (induction.measure(p, setup.config, data) for p in (params, again))
    assert a.acc_repeated_segment > 0.9 and abs(a.acc_repeated_segment - b.acc_repeated_segment) <= 0.02
    assert induction.best_heads(a) == induction.best_heads(b)


def test_the_command_line_writes_the_files_it_is_given(monkeypatch, capsys):
    wrote = []
    monkeypatch.setattr(retrain_shipped, "write", lambda names: wrote.append(names))
    assert retrain_shipped.main([shipped.INDUCTION_FILE]) == 0 and wrote == [(shipped.INDUCTION_FILE,)]
    assert retrain_shipped.main([]) == 0 and wrote[-1] == (shipped.ENCODER_FILE, shipped.INDUCTION_FILE)
    assert retrain_shipped.main(["decoder.npz"]) == 1 and len(wrote) == 2
    assert "unknown file 'decoder.npz'" in capsys.readouterr().err
