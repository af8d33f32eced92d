"""The training loop: determinism, exact resumption, bounds, the command line, and that the model
actually learns (the sum task to 97 % test accuracy; positions matter for 'increasing')."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from core.training import encoder_runs
from core.training.tasks import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def sum_data():
    return make_dataset("sum", 1000, 200, 200, seed=0)


def _run(data, steps, seed=0, state=None, **kwargs):
    if state is None:
        state = encoder_runs.new_state(encoder_runs.config_for("sum"), data, seed=seed, decay_steps=60)
    metrics = list(encoder_runs.train(state, data, max_steps=steps, eval_every=10, **kwargs))
    return state, metrics


def _same(a, b):
    return all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


def test_deterministic_for_a_seed(sum_data):
    a, ma = _run(sum_data, 20)
    b, mb = _run(sum_data, 20)
    c, _ = _run(sum_data, 20, seed=1)
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb]
    assert _same(a, b) and not _same(a, c)
    assert [m["step"] for m in ma] == list(range(1, 21))
    assert {"step", "loss", "train_acc", "val_acc", "elapsed", "ms_per_step", "evaluated"} <= set(ma[-1])
    assert ma[-1]["evaluated"] and 0.0 <= ma[-1]["val_acc"] <= 1.0


def test_resume_matches_an_uninterrupted_run(sum_data):
    straight, m_straight = _run(sum_data, 40)
    resumed, m_first = _run(sum_data, 25)
    resumed, m_second = _run(sum_data, 40, state=resumed)
    assert [m["step"] for m in m_second] == list(range(26, 41))
    assert [m["loss"] for m in m_first + m_second] == [m["loss"] for m in m_straight]
    assert _same(straight, resumed) and resumed.optimizer.t == straight.optimizer.t == 40
    assert m_second[-1]["val_acc"] == m_straight[-1]["val_acc"]


def test_bounds_stop_the_run(sum_data):
    state, metrics = _run(sum_data, 1000, max_seconds=0.0)
    assert len(metrics) == 1 and metrics[-1]["evaluated"]
    state, metrics = _run(sum_data, 1000, target_val_acc=0.0)
    assert len(metrics) == 10       # stops at the first evaluation that reaches the target
    state, metrics = _run(sum_data, 5)
    assert state.step == 5 and list(encoder_runs.train(state, sum_data, max_steps=5)) == []


def test_sum_task_reaches_97_percent_test_accuracy():
    result = encoder_runs.run("sum", 600, seed=0, lr=3e-3)
    assert result["test_acc"] >= 0.97, result["test_acc"]
    table = encoder_runs.confusion_table(result["state"], result["data"].X_test, result["data"].y_test)
    assert table.sum() == len(result["data"].y_test)
    assert np.trace(table) / table.sum() == pytest.approx(result["test_acc"])


def test_positions_matter_for_the_increasing_task():
    with_pe = encoder_runs.run("increasing", 600, seed=0, lr=3e-3, positional="sinusoidal")
    without = encoder_runs.run("increasing", 600, seed=0, lr=3e-3, positional="none")
    # negatives hold the same tokens as positives: without positions the model sits at chance
    assert abs(without["test_acc"] - 0.5) < 0.08
    assert with_pe["test_acc"] >= without["test_acc"] + 0.1, (with_pe["test_acc"], without["test_acc"])


def test_command_line_prints_json_last():
    out = subprocess.run([sys.executable, "-m", "core.training", "--task", "sum", "--steps", "30", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) >= 2 and lines[0].startswith("step")
    summary = json.loads(lines[-1])
    assert set(summary) == {"task", "steps", "val_acc", "train_seconds", "ms_per_step", "step"}
    assert summary["task"] == "sum" and summary["steps"] == 30 and 0.0 <= summary["val_acc"] <= 1.0
    assert summary["step"] == "compiled"
    readable = subprocess.run([sys.executable, "-m", "core.training", "--task", "sum", "--steps", "30", "--json",
                               "--step", "readable"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert readable.returncode == 0, readable.stderr
    assert json.loads(readable.stdout.strip().splitlines()[-1])["step"] == "readable"
    bad = subprocess.run([sys.executable, "-m", "core.training", "--task", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "invalid choice" in bad.stderr


def test_a_seed_gives_the_same_numbers_alone_two_at_once_and_beside_numpy_work(sum_data):
    """Streamlit runs each session in its own thread. A run with a seed must end with the same
    parameters, bit for bit, whether it trains alone, while another session trains, or while
    another thread does ordinary NumPy work (large matrix products, on NumPy's BLAS threads)."""
    import threading

    steps = 25
    alone = [_run(sum_data, steps, seed=s)[0] for s in (0, 1)]

    # 1. two sessions training at once
    together = [None, None]

    def session(i):
        together[i] = _run(sum_data, steps, seed=i)[0]

    threads = [threading.Thread(target=session, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(s is not None for s in together), "a training thread did not finish"

    # 2. one session training while another thread multiplies big matrices
    stop = threading.Event()

    def numpy_work():
        a = np.random.default_rng(2).standard_normal((300, 300))
        while not stop.is_set():
            a = np.tanh(a @ a.T / 300.0)

    busy = threading.Thread(target=numpy_work)
    busy.start()
    try:
        beside = _run(sum_data, steps, seed=0)[0]
    finally:
        stop.set()
        busy.join(timeout=60)

    for name in alone[0].params:
        for i in (0, 1):
            assert np.array_equal(alone[i].params[name], together[i].params[name]), f"seed {i}, two at once: {name}"
        assert np.array_equal(alone[0].params[name], beside.params[name]), f"beside NumPy work: {name}"


def test_default_model_is_deterministic_by_seed():
    a = encoder_runs.train_default("sum", 3, n_train=64, n_val=8, n_test=16, steps=4)
    b = encoder_runs.train_default("sum", 3, n_train=64, n_val=8, n_test=16, steps=4)
    c = encoder_runs.train_default("sum", 4, n_train=64, n_val=8, n_test=16, steps=4)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    assert not np.array_equal(a.params["embed"], c.params["embed"])
    assert a.cfg == b.cfg and a.cfg.n_layers == 2 and a.cfg.n_heads == 4
