"""Induction heads: the measures on hand-built maps, then a trained two-layer attention-only model
(a fixed seed) against the done-when figures, and the command line."""
import json
import subprocess
import sys

import numpy as np
import pytest

from core.training import induction as I

SETUP = I.InductionSetup()
N, T = SETUP.half, 2 * SETUP.half - 1


def test_data_is_a_random_half_repeated_once():
    tgt_in, tgt_out = I.make_data(5, seed=3)
    seq = np.concatenate([tgt_in, tgt_out[:, -1:]], axis=1)
    assert seq.shape == (5, 2 * N)
    assert (seq[:, :N] == seq[:, N:]).all()
    assert (tgt_out[:, :-1] == tgt_in[:, 1:]).all()
    assert all(len(set(row[:N])) == N for row in seq)                  # distinct: one earlier copy
    assert (I.make_data(5, seed=3)[0] == tgt_in).all()
    assert not (I.held_out(SETUP)[0][:5] == I.make_data(5, rng=np.random.default_rng([0, 1]))[0]).all()


@pytest.fixture(scope="module")
def trained():
    run = I.train_induction(SETUP, seed=0)
    return run, I.measure(run.params, run.cfg, I.held_out(SETUP))


def test_a_layer_two_head_does_induction_and_the_repeated_half_is_learned(trained):
    run, m = trained
    assert m.induction.shape == m.previous.shape == (2, SETUP.n_heads)
    assert m.induction[1].max() >= 0.5                                   # layer 2, held-out sequences
    assert m.loss_second_half < 0.5 * m.loss_first_half
    assert m.acc_second_half > 0.9
    # a previous-token head in layer 1: well above what a uniform map puts on t - 1
    uniform_prev, _ = I.uniform_baselines(T, N)
    assert m.previous[0].max() > 1.5 * uniform_prev
    print(f"induction {m.induction.round(3).tolist()} previous {m.previous.round(3).tolist()} "
          f"losses {m.loss_first_half:.3f} / {m.loss_second_half:.3f} in {run.train_seconds:.1f} s")


def test_same_seed_same_model(trained):
    run, _ = trained
    setup = I.InductionSetup(steps=5)
    a, b = I.train_induction(setup, seed=4), I.train_induction(setup, seed=4)
    assert a.losses == b.losses
    assert all((a.params[k] == b.params[k]).all() for k in a.params)
    assert I.train_induction(setup, seed=5).losses != a.losses


def test_bad_setups_are_refused():
    with pytest.raises(ValueError, match="half must be between 2 and vocab_size"):
        I.InductionSetup(half=30, vocab_size=20)


def test_the_command_line_reports_the_usual_keys_and_the_induction_measures():
    out = subprocess.run([sys.executable, "-m", "core.training", "--task", "induction", "--steps", "3", "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["task"] == "induction" and result["steps"] == 3
    for key in ("val_acc", "train_seconds", "ms_per_step", "induction_score", "loss_first_half", "loss_second_half"):
        assert isinstance(result[key], float), key


def test_a_head_is_named_only_when_its_score_reaches_the_threshold():
    L, H, B = 2, 3, 1
    m = I.Measures(induction=np.array([[0.9, 0.0, 0.0], [0.05, 0.24, 0.1]]),
                   previous=np.array([[0.2, 0.6, 0.1], [0.99, 0.0, 0.0]]), loss_by_position=np.zeros(T),
                   loss_first_half=0.0, loss_second_half=0.0, acc_second_half=0.0, attn=np.zeros((L, B, H, T, T)))
    prev, ind = I.head_verdicts(m)
    assert (prev.layer, prev.head, prev.formed) == (0, 1, True)       # layer 1 only, however layer 2 scores
    assert (ind.layer, ind.head, ind.formed) == (1, 1, False)         # 0.24 < 0.25: not an induction head
    m.induction[1, 2] = I.INDUCTION_THRESHOLD
    assert I.head_verdicts(m)[1].formed and I.head_verdicts(m)[1].head == 2
    best = I.best_first_half_losses(SETUP)
    np.testing.assert_allclose(best, [np.log(SETUP.vocab_size - t - 1) for t in range(N - 1)])
