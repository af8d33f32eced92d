"""The "Make it fast" page: its table has one row per chosen T and kernel, with positive times and
GFLOP/s equal to the flop count over the time; a cell with no number says why in words; a machine
too busy to time fairly gets a message, a button to measure again and no share of the ceiling;
every control changes the table and the link; bad input gets a message; each trick is shown with
the source of the functions it names. Its last section times a matrix product step by step: the
rows name the shape chosen (kept in the link), and the chart draws the table's GFLOP/s."""
import contextlib
import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from streamlit import dataframe_util

from core import readiness, warmup
from core.kernels.tuned import target
from core.lessons import gemm_speed, speed

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "make_it_fast.py")
SMALL = {"T": "6, 16", "H": "2", "dk": "8"}      # a link with sizes that time in well under a second
GEMM_BUTTON = "Time the five steps"


@pytest.fixture(autouse=True)
def no_earlier_ceiling(monkeypatch):
    """Each test starts as a fresh server: no ceiling measured before (a patched one would otherwise
    make every later reading look like a busy machine)."""
    monkeypatch.setitem(speed._fastest_ceiling, "gflops", 0.0)


def timings(at):
    """The table of times (the dataframe whose first column is T)."""
    found = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == "T"]
    assert len(found) == 1, f"expected one timing table, found {len(found)}"
    return found[0]


def ceiling(at):
    return float(re.match(r"([\d.]+) GFLOP/s", next(m.value for m in at.metric if m.label == "sgemm ceiling"))[1])


NUMBERS = ("time (µs)", "GFLOP/s", "% of sgemm")
BUSY = "too busy to time fairly"


def busy(at) -> bool:
    return any(BUSY in w.value for w in at.warning)


def headline(at):
    """The "fastest here" metric's line under its number (kernel, T and, when fair, the share)."""
    (metric,) = [m for m in at.metric if m.label == "fastest here"]
    return metric.delta


def check_table(at, lengths, n_heads, d_k, operation):
    """One row per (T, kernel); positive times; GFLOP/s = H (2 T^2 d_k + 2 T^2 d_v) / time / 1e9.

    A row may be skipped (no number, words that say why) only above ``PREDICT_FROM_T``, where a call
    predicted to take over a second is not run: on a busy machine that can happen at the default
    sizes. No cell reads "None" or "nan". The share of the ceiling is at most 100 %, and none is
    shown, in the table or the headline, when the page says the machine was busy.
    """
    assert not at.exception and not at.error
    table = timings(at)
    assert list(zip(table["T"], table["kernel"])) == [(T, k) for T in lengths for k in ("lesson", "tuned", "NumPy")]
    assert (table["operation"] == operation).all()
    cells = table[list(NUMBERS)].astype(str)
    assert not cells.apply(lambda c: c.str.contains("None|nan|NaN|inf|<NA>") | (c.str.strip() == "")).any().any()
    skipped = table["time (µs)"] == "not run"
    assert (table["note"][skipped].str.match(r"skipped: predicted about \d+\.\d s per call, over the 1 s limit")).all()
    assert (table["note"][~skipped] == "").all()
    assert (table["T"][skipped] > speed.PREDICT_FROM_T).all()
    assert (table["GFLOP/s"][skipped] == "not run").all() and (table["% of sgemm"][skipped] == "not run").all()
    measured = table[~skipped]
    micro = measured["time (µs)"].astype(float).to_numpy()        # written to 0.1 µs
    gflops = measured["GFLOP/s"].astype(float).to_numpy()         # written to 0.01 GFLOP/s
    assert (micro > 0).all()
    flops = np.array([n_heads * (2 * T * T * d_k + 2 * T * T * d_k) for T in measured["T"]])
    expected = flops / micro / 1e3
    assert (np.abs(gflops - expected) <= 0.0051 + expected * 0.051 / micro).all(), (gflops, expected)
    if busy(at):
        assert (measured["% of sgemm"] == "not shown: machine busy").all()
        assert "%" not in headline(at) and "busy" in headline(at)
        assert [b.label for b in at.button] == ["Measure again", "Measure again now", GEMM_BUTTON]
    else:
        share = measured["% of sgemm"].astype(float).to_numpy()   # written to 0.1 %
        shown = ceiling(at)                                       # written to 0.1 GFLOP/s
        np.testing.assert_allclose(share, 100 * gflops / shown, rtol=0.051 / shown + 0.0051 / gflops.min(),
                                   atol=0.051)
        assert (share <= 100).all()
        best = measured.iloc[int(np.argmax(gflops))]
        said = re.fullmatch(rf"{best['kernel']} at T = {best['T']}: (\d+)% of the ceiling", headline(at))
        assert said and abs(int(said[1]) - float(best["% of sgemm"])) <= 0.55, headline(at)   # 0.1 % vs whole %
        assert [b.label for b in at.button] == ["Measure again", GEMM_BUTTON]
    return table


def steady_timings(monkeypatch, kernel_seconds=lambda: 1e-4, sgemm_seconds=1e-3):
    """Patched timer: every kernel's timing reads ``kernel_seconds()`` (no kernel runs) and every
    sgemm ``sgemm_seconds`` (2.1 TFLOP/s at n = 1024). Returns the list of what was timed."""
    timed = []

    def best_seconds(fn, *, repeats=5, budget_s=0.15):
        if repeats == 3 and budget_s == 0.3:                      # sgemm_gflops
            timed.append("sgemm")
            return sgemm_seconds
        timed.append("kernel")
        return kernel_seconds()

    monkeypatch.setattr(speed, "best_seconds", best_seconds)
    return timed


def test_default_page_times_its_default_sizes_and_shows_the_ceiling():
    at = open_page(PAGE)
    check_table(at, (6, 64, 256, 1024), 4, 64, "with weights")
    assert ceiling(at) > 0
    assert [h.value for h in at.header] == ["Against what this machine can do", "How the tuned kernel gets there",
                                            "A matrix product, step by step"]


def test_a_ceiling_measured_below_a_kernel_is_measured_again_then_called_busy(monkeypatch):
    """sgemm is the most this machine does: when a kernel reads faster, the page measures the ceiling
    again, and when it still reads lower says the machine was busy, offers to measure again, and
    shows no share of the ceiling (it read "100 % of the ceiling")."""
    calls = []

    def slow_sgemm(n=1024, repeats=3):
        calls.append(n)
        return 1e-3                                          # GFLOP/s: below any kernel

    monkeypatch.setattr(speed, "sgemm_gflops", slow_sgemm)
    steady_timings(monkeypatch)
    at = open_page(PAGE, SMALL)
    check_table(at, (6, 16), 2, 8, "with weights")
    assert calls.count(1024) == 4                            # before, after, and twice again
    (warning,) = at.warning
    assert BUSY in warning.value and "faster than the matrix product" in warning.value
    assert not [m for m in at.metric if m.label == "BLAS kernel"]
    assert not any("100" in cell for cell in timings(at)["% of sgemm"])

    at.button(key="make_it_fast.remeasure").click().run()    # the button under the message measures again
    assert calls.count(1024) == 8 and busy(at)


def test_a_fair_ceiling_gets_no_warning_and_no_remeasure(monkeypatch):
    calls = []

    def fast_sgemm(n=1024, repeats=3):
        calls.append(n)
        return 1e6

    monkeypatch.setattr(speed, "sgemm_gflops", fast_sgemm)
    steady_timings(monkeypatch)
    at = open_page(PAGE, SMALL)
    assert calls.count(1024) == 2 and not at.warning
    check_table(at, (6, 16), 2, 8, "with weights")
    assert (timings(at)["% of sgemm"].astype(float) < 1).all()


def test_one_slow_trial_run_skips_nothing(monkeypatch):
    """On a busy machine one trial run at T = 128 read NumPy's 3 ms call at T = 256 as "about 1.1 s":
    the call was skipped and its cells read "None". A slow trial run is run again."""
    trials = []

    def probe(kernel, operation, n_heads, d_k, T):
        trials.append(kernel)
        seconds = 5.0 if trials.count(kernel) <= 2 else 1e-4  # each kernel's first two trial runs: busy
        return speed.attention_flops(n_heads, T, T, d_k) / seconds

    monkeypatch.setattr(speed, "_probe_speed", probe)
    monkeypatch.setattr(speed, "REPROBE_PAUSE_S", 0.0)
    steady_timings(monkeypatch)
    at = open_page(PAGE, {**SMALL, "T": "6, 256"})
    table = check_table(at, (6, 256), 2, 8, "with weights")
    assert not (table["time (µs)"] == "not run").any() and sorted(trials) == sorted(3 * list(speed.KERNELS))
    assert not busy(at)


def test_a_skipped_call_says_why_in_words(monkeypatch):
    monkeypatch.setattr(speed, "_probe_speed", lambda kernel, operation, n_heads, d_k, T:
                        speed.attention_flops(n_heads, T, T, d_k) / (4.0 if kernel == "lesson" else 1e-4))
    monkeypatch.setattr(speed, "REPROBE_PAUSE_S", 0.0)
    steady_timings(monkeypatch, kernel_seconds=lambda: 2e-5)
    at = open_page(PAGE, {**SMALL, "T": "6, 256"})
    table = check_table(at, (6, 256), 2, 8, "with weights")
    (row,) = table[table["time (µs)"] == "not run"].to_dict("records")
    assert (row["T"], row["kernel"], row["GFLOP/s"], row["% of sgemm"]) == (256, "lesson", "not run", "not run")
    assert row["note"].startswith("skipped: predicted about 16.0 s per call")         # 4 s at T = 128, x (256/128)^2
    assert headline(at).startswith("tuned at T = 256: ")                              # the first of the fastest


def test_passes_that_disagree_bring_the_busy_message_and_measuring_again_clears_it(monkeypatch):
    """Timings that differ tenfold between the two passes over the table: the machine was too busy
    to time, and the page says so; measured again on a quiet machine, the shares come back."""
    readings = iter([1e-5, 1e-4] * 3 + [1e-4, 1e-5] * 3)     # cell after cell: pass one, then pass two
    state = {"quiet": False}
    steady_timings(monkeypatch, kernel_seconds=lambda: 1e-4 if state["quiet"] else next(readings))
    at = open_page(PAGE, SMALL)
    assert busy(at) and "timings differed more than 3-fold" in at.warning[0].value
    check_table(at, (6, 16), 2, 8, "with weights")
    state["quiet"] = True
    at.button(key="make_it_fast.remeasure").click().run()
    assert not busy(at) and not at.warning
    check_table(at, (6, 16), 2, 8, "with weights")


def on_each_timing(monkeypatch, note):
    """Call ``note()`` each time the page starts timing something, which is then timed as usual."""
    real_best_seconds = speed.best_seconds

    def best_seconds(fn, **kwargs):
        note()
        return real_best_seconds(fn, **kwargs)

    monkeypatch.setattr(speed, "best_seconds", best_seconds)


def test_no_kernel_is_timed_while_the_servers_warm_up_compiles(monkeypatch):
    """A server's first visit comes while its warm-up compiles in another thread, which slowed a
    45 µs tuned call to 7.6 ms. The page waits for the warm-up (showing its progress), then times."""
    gate, loading, measuring = threading.Event(), threading.Event(), threading.Event()

    def step():                    # a step that loads until the gate opens
        loading.set()
        try:
            gate.wait(20)
        finally:
            loading.clear()

    warm = warmup.WarmUp(steps=[(warmup.ENCODER, step)]).start()
    monkeypatch.setattr(readiness, "_started", warm)
    pause = warm.paused

    @contextlib.contextmanager
    def paused():                  # the gate opens a second after the page asks to measure, not before
        threading.Timer(1.0, gate.set).start()
        with pause():
            measuring.set()
            try:
                yield
            finally:
                measuring.clear()

    monkeypatch.setattr(warm, "paused", paused)
    timed_during_warm_up = []
    # the step's own flag, not warm.finished: the warm-up marks itself finished a moment after its
    # last step has loaded, and a timing in that moment times nothing but the kernels; a timing outside
    # the measurement (the kernels' first call, which compiles them) is not a figure the page shows
    on_each_timing(monkeypatch, lambda: measuring.is_set() and timed_during_warm_up.append(
        loading.is_set() or not gate.is_set()))
    at = open_page(PAGE, SMALL)
    assert gate.is_set() and timed_during_warm_up and not any(timed_during_warm_up)
    check_table(at, (6, 16), 2, 8, "with weights")


def test_a_measurement_waits_while_another_session_measures(monkeypatch):
    """Two sessions timing at once slow each other (the tuned T = 256 call read 803 and 1117 µs
    against 387 alone): the page's timing starts only when the other session's has ended."""
    holding, ended = threading.Event(), []

    def other_session():
        with speed.measuring_alone():
            holding.set()
            time.sleep(1.0)
            ended.append(time.monotonic())

    started = []
    on_each_timing(monkeypatch, lambda: started.append(time.monotonic()))
    other = threading.Thread(target=other_session)
    other.start()
    assert holding.wait(5)
    at = open_page(PAGE, SMALL)
    other.join()
    assert ended and started and min(started) >= ended[0]
    check_table(at, (6, 16), 2, 8, "with weights")


def _colour_scales(spec):
    """Every colour encoding's scale in a Vega-Lite spec, layers included."""
    if isinstance(spec, dict):
        found = [spec["color"]["scale"]] if isinstance(spec.get("color"), dict) and "scale" in spec["color"] else []
        return found + [s for value in spec.values() for s in _colour_scales(value)]
    if isinstance(spec, list):
        return [s for value in spec for s in _colour_scales(value)]
    return []


def test_each_kernel_keeps_one_colour_in_every_chart():
    at = open_page(PAGE, SMALL)
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2
    scales = [scale for chart in charts for scale in _colour_scales(json.loads(chart.proto.spec))]
    assert len(scales) == 3                                  # times, rates, the ceiling's rule
    # one fixed domain, no colours of its own: the theme's series colours, in the domain's order
    assert all(scale == {"domain": [*speed.KERNELS, "sgemm ceiling"]} for scale in scales)


def test_each_control_changes_the_table_and_the_link():
    at = open_page(PAGE, SMALL)
    first = check_table(at, (6, 16), 2, 8, "with weights")
    at.run()                                                   # a plain rerun keeps the measurement
    assert timings(at).equals(first)

    at.slider(key="make_it_fast.H").set_value(3).run()
    check_table(at, (6, 16), 3, 8, "with weights")
    assert at.query_params["H"] == "3"

    at.text_input(key="make_it_fast.T").set_value("12, 6, 9").run()
    check_table(at, (6, 9, 12), 3, 8, "with weights")
    assert at.query_params["T"] == "12, 6, 9"

    at.select_slider(key="make_it_fast.dk").set_value("2").run()
    check_table(at, (6, 9, 12), 3, 2, "with weights")

    at.radio(key="make_it_fast.op").set_value(speed.OPERATIONS[1]).run()
    before = check_table(at, (6, 9, 12), 3, 2, speed.OPERATIONS[1])

    at.button[0].click().run()                                 # "Measure again": new times, same rows
    again = check_table(at, (6, 9, 12), 3, 2, speed.OPERATIONS[1])
    assert not np.array_equal(again["time (µs)"], before["time (µs)"])


@pytest.mark.parametrize("text, words", [("5, 64", "T = 5 is out of range"), ("6, lots", "not a whole number"),
                                         ("", "at least one"), ("6, 2049", "T = 2049 is out of range")])
def test_bad_lengths_get_a_message_and_no_table(text, words):
    at = open_page(PAGE, SMALL)
    at.text_input(key="make_it_fast.T").set_value(text).run()
    assert not at.exception
    assert len(at.error) == 1 and words in at.error[0].value
    assert not [d for d in at.dataframe if d.value.columns[0] == "T"]


def test_too_large_a_weight_tensor_is_refused():
    at = open_page(PAGE, {"T": "2048", "H": "8", "dk": "2"})
    assert not at.exception
    assert "128 MiB" in at.error[0].value


def test_each_trick_is_shown_beside_the_source_it_names():
    at = open_page(PAGE, SMALL)
    shown = "\n".join(c.value for c in at.code)
    for trick, functions in speed.TRICKS.items():
        for module, name in functions:
            assert f"def {name}(" in shown, f"{trick}: {name} is not shown"
    assert [s.value for s in at.subheader] == [
        f"1. Register tiles: 4 queries × {target.TILE_VECTORS} vectors of keys", "2. Keys transposed, values padded",
        "3. Online softmax (the fused kernel)", "4. A fast exp", "5. The row maximum as an integer maximum",
        "6. Views without reference counts", "7. Masked keys are skipped"]
    assert len(at.latex) >= 4


# --- the matrix product, step by step ----------------------------------------------------------------
TINY_SHAPES = {"tiny": gemm_speed.Shape("tiny", 8, 40, 96), "wide": gemm_speed.Shape("wide", 12, 64, 160)}


@pytest.fixture
def tiny_shapes(monkeypatch):
    """Shapes the steps time in milliseconds, and a steady ceiling (this section's numbers, not the
    machine's speed, are under test)."""
    monkeypatch.setattr(gemm_speed, "SHAPES", TINY_SHAPES)
    monkeypatch.setattr(speed, "sgemm_gflops", lambda n=1024, repeats=3: 1000.0)


def step_table(at):
    found = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == "step"]
    assert len(found) <= 1, f"expected at most one table of steps, found {len(found)}"
    return found[0] if found else None


def step_bars(at) -> dict:
    """The bar chart of the steps: ``{step: GFLOP/s}`` as drawn, and the ceiling's rule."""
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        layers = spec.get("layer", [])
        marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in layers]
        if "bar" not in marks:
            continue
        frames = {d.name: dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in element.proto.datasets}
        bar, rule = layers[marks.index("bar")], layers[marks.index("rule")]
        assert bar["encoding"]["x"]["field"] == "GFLOP/s" and bar["encoding"]["y"]["field"] == "step"
        bars = frames[bar.get("data", spec.get("data"))["name"]]
        ceiling_at = frames[rule["data"]["name"]]["GFLOP/s"]
        return {"bars": dict(zip(bars["step"], bars["GFLOP/s"].astype(float))), "rule": float(ceiling_at.iloc[0]),
                "tooltip": [t["field"] for t in bar["encoding"]["tooltip"]]}
    raise AssertionError("no bar chart of the steps")


def check_steps(at, shape):
    """One row per step at ``shape``; GFLOP/s = 2 M K N / time; the share of the shown ceiling and
    the speed-up over the naive loops from the same times; the chart draws the table's GFLOP/s."""
    assert not at.exception and not at.error
    table = step_table(at)
    assert list(table["step"]) == list(gemm_speed.STEPS)
    assert (table[["M", "K", "N"]].to_numpy() == [shape.M, shape.K, shape.N]).all()
    micro = table["time (µs)"].astype(float).to_numpy()
    gflops = table["GFLOP/s"].astype(float).to_numpy()
    expected = 2 * shape.M * shape.K * shape.N / micro / 1e3
    assert (micro > 0).all() and (np.abs(gflops - expected) <= 0.0051 + expected * 0.051 / micro).all()
    speed_up = table["× naive loops"].astype(float).to_numpy()
    ratio = micro[0] / micro                                   # times written to 0.1 µs, speed-ups to 0.1
    assert (np.abs(speed_up - ratio) <= 0.051 + ratio * (0.051 / micro[0] + 0.051 / micro)).all(), (speed_up, ratio)
    (shown,) = [float(re.match(r"([\d.]+) GFLOP/s", m.value)[1]) for m in at.metric
                if m.label == "sgemm ceiling, this timing"]
    if any(BUSY in w.value for w in at.warning):
        assert (table["% of sgemm"] == "not shown: machine busy").all()
    else:
        np.testing.assert_allclose(table["% of sgemm"].astype(float), 100 * gflops / shown, atol=0.051)
    drawn = step_bars(at)
    assert list(drawn["bars"]) == list(gemm_speed.STEPS) and drawn["rule"] == pytest.approx(shown, abs=0.051)
    np.testing.assert_allclose([drawn["bars"][step] for step in table["step"]], gflops, atol=0.0051)
    assert {"step", "time (µs)", "GFLOP/s"} <= set(drawn["tooltip"])
    return table


def test_the_steps_are_timed_at_the_chosen_shape_and_the_chart_draws_the_table(tiny_shapes):
    at = open_page(PAGE, SMALL)
    assert step_table(at) is None                              # timed on demand, not at every visit
    at.button(key="make_it_fast.gemm_time").click().run()
    first = check_steps(at, TINY_SHAPES["tiny"])

    at.selectbox(key="make_it_fast.gemm").set_value("wide").run()   # a new shape is timed again
    second = check_steps(at, TINY_SHAPES["wide"])
    assert at.query_params["gemm"] == "wide"
    assert not np.array_equal(first[["M", "K", "N"]].to_numpy(), second[["M", "K", "N"]].to_numpy())
    at.run()                                                   # a plain rerun keeps the timing
    assert step_table(at).equals(second)


def test_the_link_keeps_the_shape(tiny_shapes):
    at = open_page(PAGE, {**SMALL, "gemm": "wide"})
    assert at.selectbox(key="make_it_fast.gemm").value == "wide" and at.query_params["gemm"] == "wide"
    at.button(key="make_it_fast.gemm_time").click().run()
    check_steps(at, TINY_SHAPES["wide"])


def test_each_step_is_explained_beside_its_source(tiny_shapes):
    at = open_page(PAGE, SMALL)
    shown, texts = "\n".join(c.value for c in at.code), [m.value for m in at.markdown]
    for i, step in enumerate(gemm_speed.STEPS, 1):
        assert any(text.startswith(f"**{i}. {step}.** ") for text in texts), f"{step} is not explained"
        for name, _ in gemm_speed.sources(step):
            assert f"def {name.rsplit('.', 1)[1]}(" in shown, f"{step}: {name} is not shown"
    assert "y = x @ W" in shown
