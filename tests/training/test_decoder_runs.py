"""The decoder tasks' defaults: reverse learns with them in under 30 s, the command line reports
them, and the page "Decoder and generation" trains with the same ones."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from core.model import presets
from core.training import decoder_runs as R

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_reverse_reaches_95_percent_exact_match_within_30_seconds_with_the_defaults():
    run = R.train_task("reverse", seed=0)
    assert run.steps == R.DEFAULTS["reverse"].steps
    assert run.val_acc >= 0.95, run.val_acc
    assert run.train_seconds < 30.0, run.train_seconds
    assert run.losses[-1] < 0.1 * run.losses[0]


def test_a_seed_gives_the_same_run_and_another_seed_another():
    a, b, c = (R.train_task("sort", steps=5, seed=s) for s in (0, 0, 1))
    assert a.losses == b.losses and a.losses != c.losses
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


def test_build_applies_overrides_and_refuses_unknown_tasks():
    setup = R.build("sort", seq_len=5, d_model=16, n_train=100, n_val=20)
    ds = setup.data
    assert setup.cfg == presets.seq2seq(ds.vocab_size, 5, ds.src_vocab_size, 5, d_model=16, bos_id=ds.bos_id)
    assert setup.data.src_train.shape == (100, 5)
    lm = R.build(R.LM_TASK)
    assert lm.cfg == presets.decoder_lm(lm.data.vocab.size, R.DEFAULTS[R.LM_TASK].seq_len)
    with pytest.raises(ValueError, match="Unknown decoder task"):
        R.build("nope")


def _cli(*args):
    out = subprocess.run([sys.executable, "-m", "core.training", *args, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_command_line_reports_the_decoder_tasks():
    rev = _cli("--task", "reverse", "--steps", "3")
    assert set(rev) == {"task", "steps", "val_acc", "train_seconds", "ms_per_step", "step"}
    assert rev["task"] == "reverse" and rev["steps"] == 3 and 0.0 <= rev["val_acc"] <= 1.0
    assert rev["step"] == "compiled" and _cli("--task", "reverse", "--steps", "3", "--step", "readable")["step"] == "readable"
    lm = _cli("--task", "lm", "--steps", "3")
    assert {"val_loss", "unigram_loss"} <= set(lm) and lm["steps"] == 3
    assert 0.0 <= lm["val_acc"] <= 1.0 and lm["val_loss"] > 0 and lm["unigram_loss"] > 0


def test_the_language_models_metrics_match_their_definitions():
    from core.model import decoder
    from core.training import tasks

    run = R.train_task(R.LM_TASK, steps=2)
    X, Y, _ = run.setup.val_arrays()
    logits, _ = decoder.forward(run.params, run.setup.cfg, X)
    assert run.val_acc == float((logits.argmax(-1) == Y).mean())
    assert np.isclose(run.metrics["val_loss"], decoder.mean_loss(run.params, run.setup.cfg, X, Y))
    assert run.metrics["unigram_loss"] == tasks.unigram_loss(run.setup.data)
