"""The induction model's runs (core.training.induction_runs): the data (a segment repeated after a
random prefix, at a random distance), seeded training, the setups refused, and the command line.
What the trained heads do is core.lessons.induction's (tests/lessons/test_induction.py)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from core.training import induction_runs as I

SETUP = I.InductionSetup()


def _layout(seq: np.ndarray) -> tuple[int, int]:
    """``(prefix, n)`` of one whole sequence, found by brute force: the first position whose token
    occurred before is the repeat's start; the earlier copy is the segment's start."""
    for i in range(len(seq)):
        earlier = np.flatnonzero(seq[:i] == seq[i])
        if earlier.size:
            return int(earlier[0]), i - int(earlier[0])
    raise AssertionError("no repeat")


def test_the_segment_repeats_to_the_end_after_a_prefix_and_at_a_distance_that_vary():
    tgt_in, tgt_out = I.make_data(64, seed=3)
    seq = np.concatenate([tgt_in[:, :1], tgt_out], axis=1)
    assert seq.shape == (64, SETUP.length) and (tgt_out[:, :-1] == tgt_in[:, 1:]).all()
    layouts = np.array([_layout(row) for row in seq])                  # (B, 2): prefix, n
    prefix, n = layouts.T
    # the repeat's place and its distance back both vary: no fixed offset finds the earlier copy
    assert len(set(prefix.tolist())) >= 5 and len(set(n.tolist())) >= 4
    assert n.min() >= SETUP.min_segment and n.max() <= SETUP.max_segment
    assert (prefix + 2 * n <= SETUP.length).all()                       # at least one whole copy
    for row, p, k in zip(seq, prefix, n):
        assert len(set(row[:p + k].tolist())) == p + k                 # prefix and first copy distinct
        segment = row[p:p + k]
        later = row[p + k:]
        assert (later == np.resize(segment, later.size)).all()          # the segment, again and again
    np.testing.assert_array_equal(I.repeat_layout(tgt_in, tgt_out), (prefix, n))
    assert (I.make_data(5, seed=3)[0] == I.make_data(5, seed=3)[0]).all()
    assert not (I.held_out(SETUP)[0][:5] == I.make_data(5, rng=np.random.default_rng([0, 1]))[0]).all()


def test_same_seed_same_model():
    setup = I.InductionSetup(steps=5)
    a, b = I.train_induction(setup, seed=4), I.train_induction(setup, seed=4)
    assert a.losses == b.losses
    assert all((a.params[k] == b.params[k]).all() for k in a.params)
    assert I.train_induction(setup, seed=5).losses != a.losses


@pytest.mark.parametrize("settings, message", [
    (dict(min_segment=1), "2 <= min_segment <= max_segment"),
    (dict(min_segment=8, max_segment=6), "2 <= min_segment <= max_segment"),
    (dict(max_segment=20, length=32), "need 40 positions"),
    (dict(vocab_size=20), "need 28 token ids"),
    (dict(n_layers=0), "positive whole numbers"),
])
def test_bad_setups_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        I.InductionSetup(**settings)


def test_the_command_line_reports_the_usual_keys_and_the_induction_measures():
    out = subprocess.run([sys.executable, "-m", "core.training", "--task", "induction", "--steps", "3", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["task"] == "induction" and result["steps"] == 3
    for key in ("val_acc", "train_seconds", "ms_per_step", "induction_score", "previous_token_score",
                "loss_first_occurrence", "loss_repeated_segment"):
        assert isinstance(result[key], float), key


def test_the_command_line_trains_the_pages_default_run_unless_told_otherwise(monkeypatch):
    """Without --steps or --lr the command line trains the setup the page opens on (InductionSetup's
    defaults), not the encoder's 300 steps at 3e-3; given, they override it."""
    from core.training import __main__ as cli

    seen = []

    def stop(setup, **_):
        seen.append(setup)
        raise KeyboardInterrupt          # stop before any training

    monkeypatch.setattr(I, "train_induction", stop)
    for argv in (["--task", "induction"], ["--task", "induction", "--steps", "40", "--lr", "0.002"]):
        with pytest.raises(KeyboardInterrupt):
            cli.main(argv)
    assert seen[0] == I.InductionSetup()
    assert seen[1] == I.InductionSetup(steps=40, lr=0.002)
