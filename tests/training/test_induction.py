"""Induction heads: the measures on hand-built maps, then a trained two-layer attention-only model
(a fixed seed) against the done-when figures, and the command line."""
import json
import subprocess
import sys

import numpy as np
import pytest

from core.models import induction as I

SETUP = I.InductionSetup()
N, T = SETUP.half, 2 * SETUP.half - 1


def _uniform_causal(T):
    A = np.tril(np.ones((T, T)))
    return A / A.sum(axis=1, keepdims=True)


def test_data_is_a_random_half_repeated_once():
    tgt_in, tgt_out = I.make_data(5, seed=3)
    seq = np.concatenate([tgt_in, tgt_out[:, -1:]], axis=1)
    assert seq.shape == (5, 2 * N)
    assert (seq[:, :N] == seq[:, N:]).all()
    assert (tgt_out[:, :-1] == tgt_in[:, 1:]).all()
    assert all(len(set(row[:N])) == N for row in seq)                  # distinct: one earlier copy
    assert (I.make_data(5, seed=3)[0] == tgt_in).all()
    assert not (I.held_out(SETUP)[0][:5] == I.make_data(5, rng=np.random.default_rng([0, 1]))[0]).all()


def test_a_perfect_induction_map_scores_one_and_a_uniform_map_its_average():
    tokens = I.make_data(3, seed=1)[0]                                  # (3, T)
    perfect = np.zeros((3, T, T))
    for t in range(T):
        perfect[:, t, t - N + 1 if t >= N else t] = 1.0                 # second half: right after the copy
    assert I.induction_score(perfect, tokens) == pytest.approx(1.0)
    uniform = np.broadcast_to(_uniform_causal(T), (3, T, T))
    expected_prev, expected_ind = I.uniform_baselines(T, N)
    assert expected_ind == pytest.approx(np.mean([1 / (t + 1) for t in range(N, T)]))
    assert I.induction_score(uniform, tokens) == pytest.approx(expected_ind, rel=1e-12)
    assert I.previous_token_score(uniform) == pytest.approx(expected_prev, rel=1e-12)
    previous = np.zeros((3, T, T))
    previous[:, np.arange(1, T), np.arange(T - 1)] = 1.0
    previous[:, 0, 0] = 1.0
    assert I.previous_token_score(previous) == pytest.approx(1.0)
    assert I.induction_score(previous, tokens) == pytest.approx(0.0)   # the copy, not the one after it
    # leading axes (layer, head) are kept
    stacked = np.stack([perfect, uniform])[:, :, None]                  # (2, B, 1, T, T) -> layer-like axis
    assert I.induction_score(np.moveaxis(stacked, 1, 2), tokens).shape == (2, 1)


def test_induction_targets_follow_the_tokens_not_the_positions():
    tokens = np.array([[4, 7, 4, 9, 7]])
    targets = I.induction_targets(tokens)[0]
    assert np.argwhere(targets).tolist() == [[2, 1], [4, 2]]           # 4 was followed by 7; 7 by 4
    with pytest.raises(ValueError, match="No token repeats"):
        I.induction_score(np.ones((1, 3, 3)) / 3, np.array([[1, 2, 3]]))


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
