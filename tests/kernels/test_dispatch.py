"""The dispatch between lesson and tuned kernels, and the record of what ran that the pages show.

- the backend and the problem size choose the kernels (a track can be forced), and the record says
  which ran; a call from code gets the tuned kernels past the measured crossover, a lesson page
  the lesson kernels at every size;
- the record of a lesson driver is exactly the kernels its table says it runs (``tests/kernel_tables.py``);
- at any size a lesson page allows, every function recorded is a lesson one: one screen long,
  no SIMD types, borrowed views or bit tricks;
- two threads (two Streamlit sessions) recording at once each see only their own calls;
- the one-head page shows, in its "Kernel source" expander, the functions that computed its numbers.
"""
from __future__ import annotations

import inspect
import threading
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core import attention as at
from core import backend, masks, positional
from core.kernels import cpu as lesson_cpu
from core.kernels import dispatch
from core.kernels import gpu as lesson_gpu
from core.kernels.tuned import cpu as tuned_cpu
from core.limits import MAX_D_K, MAX_D_MODEL, MAX_HEADS, MAX_PE_POSITIONS, MAX_TOKENS
from ui.widgets import BACKEND_KEY, SOURCES_KEY

from kernel_tables import DRIVERS, table_of
from page_support import matrix_named

ROOT = Path(__file__).resolve().parents[2]
needs_cuda = pytest.mark.skipif(not backend.cuda_usable(), reason="no GPU and no CUDA simulator")


def names(functions) -> list[str]:
    return [f.__name__ for f in functions]


def source_file(fn) -> str:
    return Path(inspect.getsourcefile(fn)).relative_to(ROOT).as_posix()


def qkv(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


# --- the choice --------------------------------------------------------------------------------


def test_backend_and_size_choose_the_kernels():
    for operation, large in dispatch.TUNED_FROM.items():
        assert dispatch.kernels_for("cpu", 1, operation) is lesson_cpu
        assert dispatch.kernels_for("cpu", large - 1, operation) is lesson_cpu
        assert dispatch.kernels_for("cpu", large, operation) is tuned_cpu
        if backend.cuda_usable():
            assert dispatch.kernels_for("cuda", 1, operation) is lesson_gpu
            assert dispatch.kernels_for("cuda", large, operation) is lesson_gpu


def test_a_mid_size_call_from_code_runs_the_tuned_kernels():
    """A notebook's H=8, T=64, d=16 (2M multiply-adds), and H=4, T=16, d=8 (16k, past the measured
    crossover), get the faster track, and the record says so."""
    for shape in ((8, 64, 16), (4, 16, 8)):
        Q, K, V = qkv(shape, dtype=np.float32)
        with dispatch.recording() as ran:
            at.attention(Q, K, V, masks.causal(shape[1]), backend="cpu")
            at.attention(Q, K, V, backend="cpu", return_weights=False)
        assert [(c.operation, c.track) for c in ran] == [("attention_with_weights", "tuned"),
                                                         ("fused_attention", "tuned")]


@pytest.fixture
def set_track_env(monkeypatch):
    """``set_track_env(value)`` sets ``ATTN_KERNELS`` as a process started with it would see it (the
    dispatch reads it once, like ``ATTN_BACKEND``); the variable is restored afterwards."""
    def set_env(value):
        monkeypatch.setenv(dispatch.TRACK_ENV, value)
        dispatch.refresh()
    yield set_env
    monkeypatch.undo()
    dispatch.refresh()


def test_either_track_can_be_forced_for_a_block_or_a_process(set_track_env):
    Q, K, V = qkv((8, 64, 16), dtype=np.float32)
    with dispatch.track("lesson"), dispatch.recording() as ran:
        out_lesson, _ = at.attention(Q, K, V, backend="cpu")
    assert [c.track for c in ran] == ["lesson"]
    small = qkv((1, 2, 2), dtype=np.float32)
    set_track_env("tuned")
    with dispatch.recording() as ran:
        at.attention(*small, backend="cpu")
        out_tuned, _ = at.attention(Q, K, V, backend="cpu")
        with dispatch.track("lesson"):                       # a block overrides the variable
            at.attention(*small, backend="cpu")
    assert [c.track for c in ran] == ["tuned", "tuned", "lesson"]
    np.testing.assert_allclose(out_tuned, out_lesson, rtol=1e-5, atol=1e-6)
    set_track_env("fastest")
    with pytest.raises(ValueError, match="ATTN_KERNELS"):
        at.attention(*small, backend="cpu")
    with pytest.raises(ValueError, match="Unknown kernel track"):
        with dispatch.track("quick"):
            pass


def test_the_lesson_pages_largest_inputs_run_the_lesson_kernels():
    """What a lesson page records (``lesson_recording``) runs
    the lesson kernels at every size a page allows (core/limits.py): multi-head attention with every
    head of the widest width over the longest sentence (one-hot values, d_v = T), and the
    positional page's largest code, though a call from code of that size runs the tuned ones."""
    Q, K, _ = qkv((MAX_HEADS, MAX_TOKENS, MAX_D_K))
    values = np.broadcast_to(np.eye(MAX_TOKENS), (MAX_HEADS, MAX_TOKENS, MAX_TOKENS)).copy()
    with dispatch.lesson_recording() as ran:
        at.attention(Q, K, values, masks.causal(MAX_TOKENS), backend="cpu")
        positional.sinusoidal(MAX_PE_POSITIONS, MAX_D_MODEL, backend="cpu")
    assert [call.module for call in ran] == [dispatch.LESSON_CPU] * 2
    with dispatch.recording() as ran:
        at.attention(Q, K, values, masks.causal(MAX_TOKENS), backend="cpu")
    assert [call.module for call in ran] == [dispatch.TUNED_CPU]


# --- the record --------------------------------------------------------------------------------


def test_size_changes_the_recorded_functions():
    with dispatch.recording() as small:
        at.attention(*qkv((4, 6, 2)), backend="cpu")
    with dispatch.recording() as large:
        at.attention(*qkv((1, 8, 64, 32)), backend="cpu")
    assert [(c.operation, c.module, c.track, c.device) for c in small] == [
        ("attention_with_weights", "core.kernels.cpu", "lesson", "cpu")]
    assert [(c.operation, c.module, c.track, c.device) for c in large] == [
        ("attention_with_weights", "core.kernels.tuned.cpu", "tuned", "cpu")]
    assert names(small.functions()) == ["attention_with_weights", "attention_steps", "scores_kernel",
                                        "add_mask_kernel", "softmax_kernel", "weighted_sum_kernel"]
    assert {source_file(f) for f in small.functions()} == {"core/kernels/cpu.py"}
    tuned = names(large.functions())
    assert tuned[0] == "attention_with_weights" and {"_attention_rows", "_weights_unit", "_scores_tile"} <= set(tuned)
    assert "core/kernels/tuned/cpu.py" in {source_file(f) for f in large.functions()}
    assert not set(small.functions()) & set(large.functions())
    assert small[0].seconds > 0 and large[0].seconds > 0


@needs_cuda
def test_backend_changes_the_recorded_functions():
    Q, K, V = qkv((2, 5, 3))
    records = {}
    for name in ("cpu", "cuda"):
        with dispatch.recording() as records[name]:
            at.attention(Q, K, V, masks.causal(5), backend=name)
            at.attention(Q, K, V, backend=name, return_weights=False)
    cpu_ran, gpu_ran = records["cpu"], records["cuda"]
    assert [(c.operation, c.module) for c in cpu_ran] == [("attention_with_weights", "core.kernels.cpu"),
                                                          ("fused_attention", "core.kernels.cpu")]
    assert [(c.operation, c.module, c.device) for c in gpu_ran] == [
        ("attention_with_weights", "core.kernels.gpu", "cuda"), ("fused_attention", "core.kernels.gpu", "cuda")]
    assert {source_file(f) for f in gpu_ran.functions()} == {"core/kernels/gpu.py"}
    # the kernels share their names across the two files, not their code
    assert {"scores_kernel", "softmax_kernel", "fused_attention_kernel"} <= set(names(gpu_ran.functions()))
    assert not {f.__code__ for f in cpu_ran.functions()} & {f.__code__ for f in gpu_ran.functions()}


@pytest.mark.parametrize("module", [lesson_cpu, lesson_gpu], ids=["cpu", "gpu"])
def test_a_lesson_driver_records_exactly_the_kernels_of_its_table(module):
    """What the record reads from a driver's code is the list of the kernels (and device helpers)
    each driver runs, for every driver."""
    for operation, table in table_of(module).items():
        host, kernels = dispatch.functions_of(getattr(module, operation))
        assert host[0] is getattr(module, operation)
        want = [getattr(k, "py_func", None) or k.__wrapped__ for k in table]
        assert sorted(names(kernels)) == sorted(names(want)), operation
        assert set(kernels) == set(want), operation


@pytest.mark.parametrize("backend_name", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_every_function_a_lesson_page_runs_fits_on_a_screen_without_tricks(backend_name):
    """At lesson sizes each public operation records lesson functions only: at most 40 lines,
    and none of the tuned kernels' devices (SIMD vectors, borrowed views, float bits, fast exp)."""
    rng = np.random.default_rng(1)
    X, W = rng.standard_normal((6, 4)), rng.standard_normal((4, 4))
    with dispatch.recording() as ran:
        mha = at.multi_head_attention(X, W, W, W, W, 2, masks.causal(6), backend=backend_name)
        at.filter_bank(X, W, W, mha.weights, 2, backend=backend_name)
        at.scores(X, X, backend=backend_name)
        at.attention(X, X, X, return_weights=False, backend=backend_name)
        at.attention(X, X, X, return_scores=True, backend=backend_name)
        positional.sinusoidal(6, 4, backend=backend_name)
    assert {c.operation for c in ran} == set(DRIVERS)                  # every operation ran
    assert {c.track for c in ran} == {"lesson"}
    for fn in ran.functions():
        source = inspect.getsource(fn)
        assert len(source.splitlines()) <= 40, fn.__name__
        for trick in ("simd", "borrowed", "float_bits", "fast_exp", "max_of", "prange", "fastmath"):
            assert trick not in source, (fn.__name__, trick)


def test_two_threads_recording_at_once_see_only_their_own_calls():
    """As two Streamlit sessions do: each thread records its own calls, made at the same time."""
    Q, K, V = qkv((3, 5, 2))
    start = threading.Barrier(2)
    seen, errors = {}, []

    def session(operation):
        try:
            with dispatch.recording() as ran:
                start.wait()
                for _ in range(30):
                    if operation == "scaled_scores":
                        at.scores(Q, K, backend="cpu")
                    else:
                        at.attention(Q, K, V, backend="cpu")
            seen[operation] = [call.operation for call in ran]
        except Exception as err:   # re-raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=session, args=(op,)) for op in ("scaled_scores", "attention_with_weights")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == {"scaled_scores": ["scaled_scores"] * 30, "attention_with_weights": ["attention_with_weights"] * 30}


def test_nothing_is_recorded_outside_a_block_and_nested_blocks_share():
    Q, K, V = qkv((4, 2))
    with dispatch.recording() as outer:
        at.scores(Q, K, backend="cpu")
        with dispatch.recording() as inner:
            at.attention(Q, K, V, backend="cpu")
    at.attention(Q, K, V, backend="cpu")                                  # outside: nobody hears it
    assert [c.operation for c in inner] == ["attention_with_weights"]
    assert [c.operation for c in outer] == ["scaled_scores", "attention_with_weights"]


# --- the page shows what ran -------------------------------------------------------------------

ONE_HEAD = str(ROOT / "views" / "one_head.py")


def kernel_source_blocks(page: AppTest) -> tuple[str, list[str], list[str]]:
    """The "Kernel source" expander: its label, its headings and its code blocks."""
    (expander,) = [e for e in page.expander if e.label.startswith("Kernel source")]
    return expander.label, [m.value for m in expander.markdown], [c.value for c in expander.code]


@pytest.mark.parametrize("backend_name, module", [("cpu", lesson_cpu),
                                                  pytest.param("cuda", lesson_gpu, marks=needs_cuda)])
def test_the_one_head_page_shows_the_functions_that_computed_its_numbers(backend_name, module):
    page = AppTest.from_file(ONE_HEAD, default_timeout=120)
    page.session_state[BACKEND_KEY] = backend_name
    page.session_state[SOURCES_KEY] = True          # opened: a shut source expander holds no code
    page.run()
    assert not page.exception and not page.error
    label, headings, blocks = kernel_source_blocks(page)
    assert backend.describe(backend_name) in label
    # the scores and weights at once, then the head of section 6: each driver, the host code it
    # calls, the kernels it launches; then the lesson's functions behind the other numbers
    want = [fn for driver in (module.attention_with_scores, module.attention_with_weights)
            for part in dispatch.functions_of(driver) for fn in part]
    want = list({f.__code__: f for f in want}.values())                 # each function once
    assert blocks[:len(want)] == [inspect.getsource(f).rstrip() for f in want]
    if module is lesson_cpu:
        assert names(want) == ["attention_with_scores", "attention_steps", "scores_kernel", "add_mask_kernel",
                               "softmax_kernel", "weighted_sum_kernel", "attention_with_weights"]
    assert {source_file(f) for f in want} == {f"core/kernels/{module.__name__.rsplit('.', 1)[1]}.py"}
    assert [h.split("**")[1] for h in headings[:2]] == [f"`{module.__name__}.attention_with_scores`",
                                                        f"`{module.__name__}.attention_with_weights`"]
    assert not [h for h in headings if "scaled_scores" in h]             # the scores are not computed twice
    # and those functions give the page's numbers: its weights are theirs, to the last bit
    Q, K, A = (np.ascontiguousarray(matrix_named(page, name)) for name in "QKA")   # as the kernels take them
    T, d_k = Q.shape
    mask = masks.causal(T).reshape(1, 1, T, T)
    _, want_A = module.attention_with_weights(Q.reshape(1, 1, T, d_k), K.reshape(1, 1, T, d_k),
                                              np.eye(T).reshape(1, 1, T, T), mask, 1 / np.sqrt(d_k))
    np.testing.assert_array_equal(A, want_A[0, 0])
