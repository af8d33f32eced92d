"""core.lessons.speed: flop counts, the timing helper, input checks, and that each kernel timed
computes attention (checked against the NumPy reference)."""
import builtins
import math
import threading
import time

import numpy as np
import pytest

from core.kernels import reference as ref
from core.lessons import speed


# --- arithmetic ------------------------------------------------------------------------------------


def test_attention_flops_counts_both_products_per_head():
    # Q K^T: Tq * Tk dot products of length d_k; A V: Tq * d_v dot products of length Tk;
    # a multiply and an add each. Every size different, so a swapped or missing term shows.
    H, Tq, Tk, d_k, d_v = 3, 5, 7, 2, 11
    assert speed.attention_flops(H, Tq, Tk, d_k, d_v) == H * (Tq * Tk * 2 * d_k + Tq * d_v * 2 * Tk)
    assert speed.attention_flops(H, Tq, Tk, d_k) == speed.attention_flops(H, Tq, Tk, d_k, d_k)


def test_attention_flops_of_one_square_head_is_two_matrix_products():
    n = 48
    assert speed.attention_flops(1, n, n, n) == 2 * speed.sgemm_flops(n) == 4 * n ** 3


def test_gflops_per_second():
    assert speed.gflops_per_second(3e9, 1.5) == pytest.approx(2.0)
    assert speed.gflops_per_second(2e6, 1e-3) == pytest.approx(2.0)
    assert math.isnan(speed.gflops_per_second(1e9, 0.0))
    assert math.isnan(speed.gflops_per_second(1e9, math.nan))


# --- input -----------------------------------------------------------------------------------------


def test_parse_lengths_sorts_and_drops_repeats():
    assert speed.parse_lengths("512, 6,64 ,64") == (6, 64, 512)
    assert speed.parse_lengths("6 2048") == (6, 2048)


@pytest.mark.parametrize("text, words", [
    ("", "at least one"), ("  , ", "at least one"), ("6, sixty", "not a whole number"),
    ("6.5", "not a whole number"), ("5", "T = 5 is out of range"), ("6, 2049", "T = 2049 is out of range"),
    ("-6", "out of range"), (", ".join(str(6 + i) for i in range(speed.MAX_LENGTHS + 1)), "at most"),
])
def test_parse_lengths_refuses_bad_text_with_a_message(text, words):
    with pytest.raises(ValueError, match=words):
        speed.parse_lengths(text)


def test_check_sizes():
    speed.check_sizes((6, 2048), 4, 64)                        # 64 MiB of weights: allowed
    with pytest.raises(ValueError, match="128 MiB"):
        speed.check_sizes((6, 2048), 8, 64)
    with pytest.raises(ValueError, match="Heads H = 0"):
        speed.check_sizes((6,), 0, 64)
    with pytest.raises(ValueError, match="Heads H = 9"):
        speed.check_sizes((6,), speed.MAX_HEADS + 1, 64)
    with pytest.raises(ValueError, match="d_k = 3"):
        speed.check_sizes((6,), 1, 3)
    with pytest.raises(ValueError, match="T = 4 is out of range"):
        speed.check_sizes((4, 8), 1, 2)


# --- timing ----------------------------------------------------------------------------------------


class ScriptedClock:
    """A clock that advances only when the timed function runs, by the next scripted duration."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def __call__(self):
        return self.now

    def work(self):
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_best_seconds_returns_the_fastest_round_per_call():
    # 1 ms calls: each round runs budget / repeats / 1 ms = 20 calls; one slow call in round two
    clock = ScriptedClock([1e-3] * 21 + [0.5] + [1e-3] * 200)
    seconds = speed.best_seconds(clock.work, repeats=5, budget_s=0.1, clock=clock)
    assert clock.calls == 1 + 5 * 20
    assert seconds == pytest.approx(1e-3)


def test_best_seconds_keeps_the_fastest_round_when_every_round_differs():
    # first call 4 ms; then rounds of 2 calls (budget / repeats / 4 ms) at 3, 2, 5 ms per call
    clock = ScriptedClock([4e-3, 3e-3, 3e-3, 2e-3, 2e-3, 5e-3, 5e-3])
    assert speed.best_seconds(clock.work, repeats=3, budget_s=0.025, clock=clock) == pytest.approx(2e-3)
    assert clock.calls == 7


def test_best_seconds_runs_a_slow_call_once():
    clock = ScriptedClock([2.0])
    assert speed.best_seconds(clock.work, budget_s=0.5, clock=clock) == 2.0
    assert clock.calls == 1


def test_measurements_take_turns_and_a_failed_one_frees_the_slot():
    order, holding = [], threading.Event()

    def first():
        with speed.measuring_alone():
            holding.set()
            time.sleep(0.3)
            order.append("first ends")

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(5)
    waits = []
    with speed.measuring_alone(lambda: waits.append(1), poll_s=0.05):
        order.append("second starts")
    thread.join()
    assert order == ["first ends", "second starts"] and len(waits) >= 3
    with pytest.raises(RuntimeError):
        with speed.measuring_alone():
            raise RuntimeError("a kernel failed")
    with speed.measuring_alone(lambda: pytest.fail("the slot was left held"), poll_s=0.05):
        pass


def test_best_seconds_on_a_real_function_is_positive_and_plausible():
    seconds = speed.best_seconds(lambda: sum(range(1000)), budget_s=0.02)
    assert 0 < seconds < 0.01


# --- what is timed computes attention ----------------------------------------------------------


@pytest.mark.parametrize("kernel", speed.KERNELS)
@pytest.mark.parametrize("operation", speed.OPERATIONS)
def test_each_timed_call_computes_attention(kernel, operation):
    Q, K, V = speed.attention_inputs(3, 9, 8, seed=1)
    want, _ = ref.attention(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64))
    out = speed.kernel_call(kernel, operation, Q, K, V)()
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == np.float32 and out.shape == (1, 3, 9, 8)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_kernel_call_refuses_unknown_names():
    Q, K, V = speed.attention_inputs(1, 6, 2)
    with pytest.raises(ValueError, match="Unknown kernel"):
        speed.kernel_call("BLAS", speed.OPERATIONS[0], Q, K, V)
    with pytest.raises(ValueError, match="Unknown operation"):
        speed.kernel_call("tuned", "fast", Q, K, V)


def test_attention_inputs_shape_and_seed():
    Q, K, V = speed.attention_inputs(2, 7, 8, seed=3)
    assert Q.shape == K.shape == V.shape == (1, 2, 7, 8) and Q.dtype == np.float32
    np.testing.assert_array_equal(Q, speed.attention_inputs(2, 7, 8, seed=3)[0])
    assert not np.array_equal(Q, K)


# --- one run of the page ---------------------------------------------------------------------------


def test_measure_times_every_kernel_at_every_length():
    seen = []
    rows = speed.measure([16, 6], 2, 8, speed.OPERATIONS[1], budget_s=0.01,
                         progress=lambda fraction, text: seen.append(fraction))
    assert [(r.T, r.kernel) for r in rows] == [(T, k) for T in (6, 16) for k in speed.KERNELS]
    for r in rows:
        assert r.operation == speed.OPERATIONS[1] and r.note == ""
        assert r.flops == 2 * (2 * r.T * r.T * 8 * 2)
        assert 0 < r.seconds < 1 and r.gflops == pytest.approx(r.flops / r.seconds / 1e9)
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 1.0 and len(seen) == 2 * len(rows) + 1


def test_measure_keeps_each_cells_faster_pass(monkeypatch):
    """A busy moment during one pass (a browser loading the page beside the server slowed one cell
    of a first measurement 170-fold) does not reach the table: the other pass times it again."""
    calls = []

    def best_seconds(fn, budget_s):
        calls.append(budget_s)
        return 1.0 if len(calls) == 5 else 1e-5        # the 5th cell of pass one: T = 16, tuned

    monkeypatch.setattr(speed, "best_seconds", best_seconds)
    rows = speed.measure([6, 16], 2, 8, speed.OPERATIONS[0], budget_s=0.01)
    assert [r.seconds for r in rows] == [1e-5] * 6
    assert calls == [0.005] * 12                       # two passes, half the budget each


def test_measure_skips_a_call_predicted_over_the_cap():
    rows = speed.measure([6, speed.PREDICT_FROM_T + 8], 1, 2, speed.OPERATIONS[0], budget_s=0.01,
                         call_cap_s=1e-9, pause_s=0)
    small, large = rows[:3], rows[3:]
    assert all(r.seconds > 0 and not r.note for r in small)          # never skipped at small T
    assert all(math.isnan(r.seconds) and math.isnan(r.gflops) and r.skipped and r.note.startswith("skipped")
               for r in large)


class Probes:
    """Stands in for the trial runs: ``speeds[kernel]`` lists the flops per second each trial run of
    that kernel reads, in order (the last one repeats)."""

    def __init__(self, speeds):
        self.speeds, self.calls = speeds, []

    def __call__(self, kernel, operation, n_heads, d_k, T):
        assert T == speed.PREDICT_FROM_T
        readings = self.speeds[kernel]
        self.calls.append(kernel)
        return readings[min(self.calls.count(kernel), len(readings)) - 1]


def steady_timings(monkeypatch, seconds=1e-4):
    """Every cell reads ``seconds`` per call, and no kernel runs; returns the list of cells timed."""
    timed = []

    def best_seconds(fn, budget_s):
        timed.append(budget_s)
        return seconds

    monkeypatch.setattr(speed, "best_seconds", best_seconds)
    return timed


BIG_T = 2 * speed.PREDICT_FROM_T      # 2 heads, d_k 8: 4.2 million flops a call


def test_one_slow_trial_run_does_not_skip_a_call(monkeypatch):
    """On a busy machine one trial run read NumPy's 3 ms call at T = 256 as "about 1.1 s" and the call
    was skipped. A trial run that predicts a call over the cap is run again; the fastest decides."""
    flops = speed.attention_flops(2, BIG_T, BIG_T, 8)
    slow, fast = flops / 5.0, flops / 1e-3          # predict 5 s, then 1 ms
    probes = Probes({kernel: [slow, fast] for kernel in speed.KERNELS})
    monkeypatch.setattr(speed, "_probe_speed", probes)
    timed = steady_timings(monkeypatch)
    rows = speed.measure([6, BIG_T], 2, 8, speed.OPERATIONS[0], budget_s=0.01, pause_s=0)
    assert [r.note for r in rows] == [""] * 6 and not any(r.skipped for r in rows)
    assert sorted(probes.calls) == sorted(2 * list(speed.KERNELS)) and len(timed) == 12


def test_a_call_is_skipped_only_when_every_trial_run_agrees_and_says_why(monkeypatch):
    flops = speed.attention_flops(2, BIG_T, BIG_T, 8)
    probes = Probes({"lesson": [flops / 7.0], "tuned": [flops / 1e-3], "NumPy": [flops / 9.0, flops / 6.0]})
    monkeypatch.setattr(speed, "_probe_speed", probes)
    steady_timings(monkeypatch)
    slept = []
    monkeypatch.setattr(speed.time, "sleep", slept.append)
    rows = {(r.T, r.kernel): r for r in speed.measure([6, BIG_T], 2, 8, speed.OPERATIONS[0], budget_s=0.01,
                                                      probes=3, pause_s=0.25)}
    assert not rows[BIG_T, "tuned"].skipped
    for kernel, predicted in (("lesson", "7.0"), ("NumPy", "6.0")):       # NumPy: the fastest trial run
        row = rows[BIG_T, kernel]
        assert row.skipped and math.isnan(row.gflops)
        assert row.note == (f"skipped: predicted about {predicted} s per call, over the 1 s limit "
                            f"(the fastest of 3 trial runs at T = {speed.PREDICT_FROM_T})")
        assert probes.calls.count(kernel) == 3 * 2                        # three in each of the two passes
    assert probes.calls.count("tuned") == 1
    assert slept == [0.25] * (2 * 2 * 2)                                 # between trial runs, never before the first


def test_a_call_skipped_in_one_pass_is_timed_in_the_next_when_the_machine_is_quiet_again(monkeypatch):
    flops = speed.attention_flops(2, BIG_T, BIG_T, 8)
    probes = Probes({kernel: [flops / 5.0] * 3 + [flops / 1e-3] for kernel in speed.KERNELS})
    monkeypatch.setattr(speed, "_probe_speed", probes)
    steady_timings(monkeypatch)
    rows = speed.measure([6, BIG_T], 2, 8, speed.OPERATIONS[0], budget_s=0.01, pause_s=0)
    assert not any(r.skipped or r.note for r in rows)
    assert all(r.passes == (1e-4,) for r in rows if r.T == BIG_T)         # timed in the second pass only


def test_measure_records_each_pass_and_the_spread_between_them(monkeypatch):
    answers = iter([1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5] + [1e-5] * 6)
    monkeypatch.setattr(speed, "best_seconds", lambda fn, budget_s: next(answers))
    rows = speed.measure([6, 16], 2, 8, speed.OPERATIONS[0], budget_s=0.01)
    assert [r.passes for r in rows] == [(t, 1e-5) for t in (1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5)]
    assert [r.spread for r in rows] == pytest.approx([1, 2, 3, 4, 5, 6])
    assert [r.seconds for r in rows] == [1e-5] * 6


# --- when the machine is too busy to time ----------------------------------------------------------


def timing(T=64, kernel="tuned", seconds=1e-4, passes=None):
    flops = speed.attention_flops(1, T, T, 8)
    return speed.Timing(T, kernel, speed.OPERATIONS[0], flops, seconds, "", passes or (seconds,))


def test_a_quiet_run_is_not_called_busy():
    rows = [timing(seconds=1e-4, passes=(1e-4, 2e-4)), timing(T=16), timing(T=2048, seconds=math.nan, passes=())]
    assert speed.busy_reasons(rows, [50.0, 60.0], 60.0, fastest_before=70.0) == ()


def test_a_kernel_faster_than_the_ceiling_means_a_busy_machine():
    row = timing(seconds=1e-6)                                       # 131.1 GFLOP/s
    (reason,) = speed.busy_reasons([row], [100.0, 100.0], 100.0)
    assert "faster than" in reason and f"{row.gflops:.1f} GFLOP/s" in reason and "(100.0 GFLOP/s)" in reason
    assert speed.busy_reasons([row], [140.0, 140.0], 140.0) == ()


def test_ceiling_readings_far_apart_mean_a_busy_machine():
    (reason,) = speed.busy_reasons([timing()], [10.0, 80.0], 80.0)
    assert "10.0" in reason and "80.0" in reason
    assert speed.busy_reasons([timing()], [30.0, 80.0], 80.0) == ()


def test_a_ceiling_far_below_an_earlier_one_means_a_busy_machine():
    (reason,) = speed.busy_reasons([timing()], [20.0, 20.0], 20.0, fastest_before=90.0)
    assert "20.0" in reason and "90.0" in reason
    assert speed.busy_reasons([timing()], [60.0, 60.0], 60.0, fastest_before=90.0) == ()


def test_passes_that_disagree_in_many_cells_mean_a_busy_machine():
    steady, unsteady = timing(passes=(1e-4, 1.5e-4)), timing(passes=(1e-4, 5e-4))
    (reason,) = speed.busy_reasons([unsteady, unsteady, steady, steady], [50.0], 50.0)
    assert reason.startswith("2 of 4 timings differed")
    # one slow moment in one pass is what the second pass is for
    assert speed.busy_reasons([unsteady] + [steady] * 5, [50.0], 50.0) == ()
    assert speed.busy_reasons([unsteady, unsteady] + [steady] * 7, [50.0], 50.0) == ()


def test_no_share_of_the_ceiling_from_a_busy_run_a_skipped_cell_or_over_100_percent():
    row = timing(seconds=1e-4)                                  # 1.31 GFLOP/s
    fair = speed.Measurement([row], ceiling=2.0, readings=(2.0,))
    assert fair.share(row) == pytest.approx(100 * row.gflops / 2.0)
    assert math.isnan(speed.Measurement([row], 2.0, (2.0,), busy=("busy",)).share(row))
    assert math.isnan(speed.Measurement([row], 1.0, (1.0,)).share(row))
    skipped = timing(seconds=math.nan, passes=())
    assert math.isnan(fair.share(skipped))
    assert speed.Measurement([skipped, row, timing(seconds=2e-4)], 2.0, (2.0,)).fastest is row
    assert speed.Measurement([skipped], 2.0, (2.0,)).fastest is None


def test_measure_against_ceiling_reads_the_ceiling_around_the_table_and_judges_the_machine(monkeypatch):
    monkeypatch.setitem(speed._fastest_ceiling, "gflops", 0.0)
    steady_timings(monkeypatch, seconds=1e-4)
    readings = iter([50.0, 55.0, 12.0, 11.0, 54.0, 56.0])
    monkeypatch.setattr(speed, "sgemm_gflops", lambda: next(readings))
    quiet = speed.measure_against_ceiling([6, 16], 2, 8, speed.OPERATIONS[0], budget_s=0.01)
    assert quiet.readings == (50.0, 55.0) and quiet.ceiling == 55.0 and quiet.busy == ()
    assert len(quiet.rows) == 6
    busy = speed.measure_against_ceiling([6, 16], 2, 8, speed.OPERATIONS[0], budget_s=0.01)
    assert busy.ceiling == 12.0 and busy.busy and "earlier this server measured 55.0" in busy.busy[0]
    again = speed.measure_against_ceiling([6, 16], 2, 8, speed.OPERATIONS[0], budget_s=0.01)
    assert again.ceiling == 56.0 and again.busy == ()


def test_measure_refuses_bad_sizes():
    with pytest.raises(ValueError, match="out of range"):
        speed.measure([3], 1, 2, speed.OPERATIONS[0])
    with pytest.raises(ValueError, match="Unknown operation"):
        speed.measure([6], 1, 2, "both")


def test_sgemm_gflops_is_positive():
    assert speed.sgemm_gflops(n=128, repeats=2) > 0


def test_blas_info_without_threadpoolctl_is_none(monkeypatch):
    real_import = builtins.__import__

    def no_threadpoolctl(name, *args, **kwargs):
        if name == "threadpoolctl":
            raise ImportError("not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_threadpoolctl)
    assert speed.blas_info() is None


# --- the tricks shown beside their source ---------------------------------------------------------


@pytest.mark.parametrize("trick", list(speed.TRICKS))
def test_every_trick_shows_the_functions_it_names(trick):
    sources = speed.trick_sources(trick)
    assert len(sources) == len(speed.TRICKS[trick])
    for (module, name), (qualified, source) in zip(speed.TRICKS[trick], sources):
        assert qualified == f"{module.__name__}.{name}"
        assert f"def {name}(" in source, f"{qualified} shows some other code"


def test_warm_up_compiles_both_builds_of_the_tuned_kernel_it_will_time():
    """Timing starts after the compile: the serial build (small T) and the parallel one (large T)."""
    from numba import float32

    from core.kernels import cpu as lesson_cpu
    from core.kernels.tuned import cpu as tuned_cpu

    speed.warm_up([speed.OPERATIONS[1]])
    for build in tuned_cpu._fused_kernel:                     # (serial, parallel)
        assert any(sig[0] == float32[:, :, :, ::1] for sig in build.signatures), build
    assert lesson_cpu.fused_attention_kernel.signatures


def test_checked_ceiling_remeasures_only_while_a_kernel_reads_faster():
    readings = iter([50.0, 120.0])
    assert speed.checked_ceiling(100.0, 80.0, lambda: next(readings)) == (100.0, False)   # fair: not re-measured
    assert speed.checked_ceiling(40.0, 80.0, lambda: next(readings)) == (120.0, False)    # 50, then 120
    assert speed.checked_ceiling(40.0, 80.0, lambda: 60.0) == (60.0, True)                # still below: under load


def test_percent_of_ceiling_is_no_result_over_100():
    """A kernel never beats the machine's own matrix product: a share over 100 % is a ceiling measured
    under load, and was shown as "100 % of the ceiling"."""
    assert speed.percent_of_ceiling(50.0, 200.0) == 25.0
    assert speed.percent_of_ceiling(200.0, 200.0) == 100.0
    assert math.isnan(speed.percent_of_ceiling(300.0, 200.0))
    assert math.isnan(speed.percent_of_ceiling(math.nan, 200.0))
    assert math.isnan(speed.percent_of_ceiling(50.0, math.nan))
