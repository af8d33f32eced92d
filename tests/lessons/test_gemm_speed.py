"""core.lessons.gemm_speed: each step timed computes x @ W (and a step that does not is refused before
it is timed), the naive loops are skipped only when every trial run predicts them over the cap, the
one-core step changes Numba's thread count for its own thread only and puts it back, and each step
shows the source of what it runs."""
import math
import threading

import numba
import numpy as np
import pytest

from core.kernels.tuned import gemm
from core.lessons import gemm_speed, speed

SMALL = (9, 33, 70)          # odd sizes: a last row block moved back, a padded panel, a last tile overlapping


def product_of(step, M, K, N, seed=1):
    x, W = gemm_speed.inputs(M, K, N, seed=seed)
    return x, W, gemm_speed.step_call(step, x, W, gemm.pack(W))()


# --- what is timed computes x @ W ------------------------------------------------------------------


@pytest.mark.parametrize("step", gemm_speed.STEPS)
@pytest.mark.parametrize("M, K, N", [SMALL, (16, 64, 128)])
def test_each_step_computes_x_times_W(step, M, K, N):
    x, W, y = product_of(step, M, K, N)
    assert y.dtype == np.float32 and y.shape == (M, N)
    np.testing.assert_allclose(y, x.astype(np.float64) @ W.astype(np.float64), rtol=1e-4, atol=1e-4)
    gemm_speed.check_product(step, y, x, W)                 # and the page's own check lets it through


def test_the_check_refuses_a_product_off_by_more_than_float32_rounding():
    x, W = gemm_speed.inputs(*SMALL)
    exact = x.astype(np.float64) @ W.astype(np.float64)
    gemm_speed.check_product("exact", exact.astype(np.float32), x, W)
    bound = SMALL[1] * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) @ np.abs(W.astype(np.float64)))
    off = exact.astype(np.float32)
    off[4, 7] += np.float32(3 * bound[4, 7])                # one number, three times what rounding allows
    with pytest.raises(ValueError, match=r"off by one computed a wrong product: y\[4, 7\]"):
        gemm_speed.check_product("off by one", off, x, W)
    nan = exact.astype(np.float32)
    nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="wrong product"):
        gemm_speed.check_product("NaN", nan, x, W)
    with pytest.raises(ValueError, match="float64 array"):
        gemm_speed.check_product("float64", exact, x, W)
    with pytest.raises(ValueError, match="of shape"):
        gemm_speed.check_product("transposed", exact.T.astype(np.float32), x, W)


def test_a_wrong_step_is_refused_before_anything_is_timed(monkeypatch):
    """A step that forgets W's last row (its product is off by one term in every sum) raises, naming
    the step; no step is timed."""
    real_call = gemm_speed.step_call

    def with_a_wrong_tile(step, x, W, packed):
        if step == gemm_speed.TILE:
            return lambda: x[:, :-1] @ W[:-1]
        return real_call(step, x, W, packed)

    timed = []
    monkeypatch.setattr(gemm_speed, "step_call", with_a_wrong_tile)
    monkeypatch.setattr(gemm_speed, "predicted_over_cap", lambda *args: "")
    monkeypatch.setattr(speed, "best_seconds", lambda fn, **kw: timed.append(fn) or 1e-4)
    with pytest.raises(ValueError, match="register tile computed a wrong product"):
        gemm_speed.measure(SMALL)
    assert not timed


def test_unknown_step_is_refused():
    x, W = gemm_speed.inputs(*SMALL)
    with pytest.raises(ValueError, match="Unknown step"):
        gemm_speed.step_call("Strassen", x, W, gemm.pack(W))


# --- one run ---------------------------------------------------------------------------------------


def test_measure_times_every_step_in_order():
    seen = []
    rows = gemm_speed.measure(SMALL, budget_s=0.01, progress=lambda fraction, text: seen.append(fraction))
    assert [r.step for r in rows] == list(gemm_speed.STEPS)
    for r in rows:
        assert (r.M, r.K, r.N) == SMALL and r.flops == 2 * 9 * 33 * 70 and r.note == ""
        assert 0 < r.seconds < 1 and r.gflops == pytest.approx(r.flops / r.seconds / 1e9)
        assert len(r.passes) == 2 and r.seconds == min(r.passes)
        assert gemm_speed.speed_up(r, rows) == pytest.approx(rows[0].seconds / r.seconds)
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 1.0 and len(seen) == 2 * len(rows) + 1


def ceiling_run(monkeypatch, readings, seconds=lambda: 1e-4, fastest_before=0.0):
    """:func:`gemm_speed.measure_against_ceiling` at ``SMALL`` with the sgemm readings given, every
    timing reading ``seconds()`` (the products still run, and are checked, once)."""
    monkeypatch.setitem(speed._fastest_ceiling, "gflops", fastest_before)
    readings = iter(readings)
    monkeypatch.setattr(speed, "sgemm_gflops", lambda: next(readings))
    monkeypatch.setattr(speed, "best_seconds", lambda fn, **kwargs: seconds())
    monkeypatch.setattr(gemm_speed, "predicted_over_cap", lambda *args: "")
    return gemm_speed.measure_against_ceiling(SMALL, budget_s=0.01)


def test_measure_against_ceiling_reads_the_ceiling_around_the_steps(monkeypatch):
    result = ceiling_run(monkeypatch, [500.0, 600.0])
    assert result.readings == (500.0, 600.0) and result.ceiling == 600.0 and result.busy == ()
    assert speed._fastest_ceiling["gflops"] == 600.0
    for row in result.rows:
        assert row.seconds == 1e-4 and result.share(row) == pytest.approx(100 * row.gflops / 600.0)


def test_a_step_faster_than_the_ceiling_is_a_result_not_a_busy_machine(monkeypatch):
    """The ceiling is BLAS on one large product, and our packed product can outrun it (a quiet run:
    about 190 GFLOP/s at 64 x 768 x 3072 against 162 for the 1024 x 1024 sgemm): no busy verdict,
    no ceiling measured again, and the share over 100 % shown."""
    result = ceiling_run(monkeypatch, [0.01, 0.011])             # every step faster than 0.011 GFLOP/s
    assert result.busy == () and len(result.readings) == 2
    assert all(result.share(row) > 100 for row in result.rows)


@pytest.mark.parametrize("readings, before, words", [
    ([500.0, 100.0], 0.0, "read 100.0 GFLOP/s at one moment and 500.0"),
    ([600.0, 600.0], 2000.0, "earlier this server measured 2000.0")])
def test_a_ceiling_read_on_a_busy_machine_hides_the_shares(monkeypatch, readings, before, words):
    result = ceiling_run(monkeypatch, readings, fastest_before=before)
    (reason,) = result.busy
    assert words in reason and all(math.isnan(result.share(row)) for row in result.rows)


def test_passes_that_disagree_mean_a_busy_machine(monkeypatch):
    times = iter([1e-4] * 5 + [1e-3] * 5)                          # pass one, then ten times slower
    result = ceiling_run(monkeypatch, [600.0, 600.0], seconds=lambda: next(times))
    (reason,) = result.busy
    assert reason.startswith("5 of 5 timings differed")


# --- the naive loops' call, predicted --------------------------------------------------------------


class Trials:
    """Stands in for the naive loops' trial runs: each returns the next predicted seconds (the last repeats)."""

    def __init__(self, *seconds):
        self.seconds, self.calls = seconds, 0

    def __call__(self, x, W):
        self.calls += 1
        return self.seconds[min(self.calls, len(self.seconds)) - 1]


def test_the_naive_loops_are_skipped_when_every_trial_run_predicts_them_over_the_cap(monkeypatch):
    trials = Trials(7.0, 5.0, 6.0)
    monkeypatch.setattr(gemm_speed, "probe_seconds", trials)
    slept = []
    monkeypatch.setattr(gemm_speed.time, "sleep", slept.append)
    rows = gemm_speed.measure(SMALL, budget_s=0.01, pause_s=0.25)
    naive, others = rows[0], rows[1:]
    assert naive.step == gemm_speed.NAIVE and naive.skipped and math.isnan(naive.gflops) and naive.passes == ()
    assert naive.note == ("skipped: predicted about 5.0 s per call, over the 1 s limit (the fastest of 3 trial runs "
                          "on 4 of the 9 rows)")
    assert trials.calls == speed.PROBES and slept == [0.25] * (speed.PROBES - 1)
    assert all(r.seconds > 0 and not r.note for r in others)
    assert all(math.isnan(gemm_speed.speed_up(r, rows)) for r in rows)


def test_one_slow_trial_run_skips_nothing(monkeypatch):
    trials = Trials(5.0, 1e-3)
    monkeypatch.setattr(gemm_speed, "probe_seconds", trials)
    rows = gemm_speed.measure(SMALL, budget_s=0.01, pause_s=0)
    assert trials.calls == 2 and not rows[0].skipped and rows[0].note == ""


def test_the_trial_run_is_on_a_few_rows_scaled_to_all_of_them(monkeypatch):
    x, W = gemm_speed.inputs(64, 16, 80)
    tried = []

    def best_seconds(fn, **kwargs):
        tried.append(fn().shape)                   # what the trial run computes
        return 2e-3

    monkeypatch.setattr(speed, "best_seconds", best_seconds)
    assert gemm_speed.probe_seconds(x, W) == pytest.approx(2e-3 * 64 / gemm_speed.PROBE_ROWS)
    assert tried == [(gemm_speed.PROBE_ROWS, 80)]


def test_a_real_trial_run_skips_the_naive_loops_under_a_tiny_cap():
    rows = gemm_speed.measure(SMALL, budget_s=0.01, call_cap_s=1e-9, pause_s=0)
    assert rows[0].skipped and rows[0].note.startswith("skipped: predicted about")
    assert all(r.seconds > 0 for r in rows[1:])


# --- Numba's thread count --------------------------------------------------------------------------


def threads_inside(monkeypatch):
    """Numba's thread count in the calling thread, read each time gemm.matmul runs."""
    seen = []
    real = gemm.matmul

    def matmul(x, packed, *args, **kwargs):
        seen.append(numba.get_num_threads())
        return real(x, packed, *args, **kwargs)

    monkeypatch.setattr(gemm, "matmul", matmul)
    return seen


def run_step(step):
    x, W = gemm_speed.inputs(*SMALL)
    return gemm_speed.step_call(step, x, W, gemm.pack(W))()


def test_the_one_core_step_runs_on_one_thread_and_restores_the_count(monkeypatch):
    seen = threads_inside(monkeypatch)
    before = numba.get_num_threads()
    run_step(gemm_speed.PACKED_ONE)
    assert seen == [1] and numba.get_num_threads() == before
    run_step(gemm_speed.PACKED_ALL)
    assert seen == [1, gemm_speed.ALL_THREADS] and numba.get_num_threads() == before


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one thread: no count below the default to keep")
def test_a_count_the_caller_lowered_is_put_back_too(monkeypatch):
    seen = threads_inside(monkeypatch)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        run_step(gemm_speed.PACKED_ALL)
        assert seen == [gemm_speed.ALL_THREADS] and numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)


def test_the_count_is_restored_when_the_product_fails(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("the product failed")

    monkeypatch.setattr(gemm, "matmul", failing)
    before = numba.get_num_threads()
    with pytest.raises(RuntimeError, match="the product failed"):
        run_step(gemm_speed.PACKED_ONE)
    assert numba.get_num_threads() == before


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one thread: every count is the same")
def test_sessions_timing_at_once_keep_their_own_counts(monkeypatch):
    """Sessions share the server's process, each running in a thread of its own: one session's
    one-core step neither holds another's product to one thread nor leaves it another's count."""
    inside, done, seen, after = threading.Event(), threading.Event(), {}, {}
    real = gemm.matmul

    def matmul(x, packed, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            seen["main"] = numba.get_num_threads()
        else:                                      # the other session: inside its product until told
            seen["other"] = numba.get_num_threads()
            inside.set()
            assert done.wait(10)
        return real(x, packed, *args, **kwargs)

    def other_session():
        numba.set_num_threads(1)                   # a session whose thread had lowered its own count
        run_step(gemm_speed.PACKED_ALL)
        after["other"] = numba.get_num_threads()

    monkeypatch.setattr(gemm, "matmul", matmul)
    other = threading.Thread(target=other_session)
    other.start()
    try:
        assert inside.wait(10)
        before = numba.get_num_threads()
        run_step(gemm_speed.PACKED_ONE)            # while the other session's product is running
        assert seen["main"] == 1 and numba.get_num_threads() == before
    finally:
        done.set()
        other.join()
    assert seen["other"] == gemm_speed.ALL_THREADS and after["other"] == 1


# --- sources ---------------------------------------------------------------------------------------


def test_each_step_shows_the_source_of_the_functions_it_runs():
    tile = "tile4" if gemm.TILE_VECTORS == 4 else "tile3"
    expected = {gemm_speed.NAIVE: ["core.kernels.matmul.matmul_kernel"],
                gemm_speed.TILE: ["core.model.tuned.products.project", f"core.kernels.tuned.gemm.{tile}"],
                gemm_speed.PACKED_ONE: ["core.kernels.tuned.gemm.pack", "core.kernels.tuned.gemm._matmul"],
                gemm_speed.PACKED_ALL: ["core.kernels.tuned.gemm._matmul"],
                gemm_speed.BLAS: []}
    for step in gemm_speed.STEPS:
        found = gemm_speed.sources(step)
        assert [name for name, _ in found] == expected[step]
        for name, source in found:
            assert f"def {name.rsplit('.', 1)[1]}(" in source, f"{name} shows some other code"
