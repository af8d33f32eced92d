"""The record of what ran (core/recording.py), which every page's source expander reads.

- a @recorded call inside ``recording()`` notes itself and every function of core it runs (its
  compiled ones included, with their builds), and no function it did not run;
- the machinery (recording, dispatch) is not noted; a closure or comprehension stands for the
  function it is written in;
- outside a block nothing is noted and no profile hook stays behind, also after an error or
  under another profiler;
- each function once, in the order first run; nested blocks, continued blocks and merged records;
- two threads recording at once each see only their own calls.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from core import attention as at
from core import recording as R
from core.kernels import cpu as lesson_cpu
from core.kernels import dispatch
from core.recording import Record, note, recorded, recording
from core.training import loop


def qkv(T=3, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((T, d)) for _ in range(3))


def names(ran: Record) -> list[str]:
    return [f"{f.__module__}.{f.__qualname__}" for f in ran.functions()]


def test_a_recorded_call_notes_every_function_of_core_it_runs_and_no_other():
    at.attention(*qkv(), return_weights=False, backend="cpu")   # loaded: a first call compiles out of sight
    with dispatch.track("lesson"), recording() as ran:
        recorded(at.attention)(*qkv(), return_weights=False)
    shown = names(ran)
    assert shown[0] == "core.attention.attention"                       # the marked call first
    assert {"core.attention._leading", "core.kernels.cpu.fused_attention",
            "core.kernels.cpu.fused_attention_kernel"} <= set(shown)
    assert "core.kernels.cpu.attention_with_weights" not in shown        # the branch not taken
    assert not [n for n in shown if n.startswith(("core.recording", "core.kernels.dispatch", "core.validate"))]
    assert len(shown) == len(set(shown))
    # the compiled kernel, called from Python, is noted with its build; dispatch added its call
    assert ran.build_of(lesson_cpu.fused_attention_kernel.py_func) is lesson_cpu.fused_attention_kernel
    assert [call.operation for call in ran] == ["fused_attention"]


def test_what_a_compiled_function_calls_inside_numba_is_read_from_its_code():
    with dispatch.track("lesson"), recording() as ran:
        recorded(at.attention)(*qkv())
    inside = [k.__name__ for k in dispatch.functions_behind(ran)]
    assert inside.index("attention_steps") < inside.index("scores_kernel") < inside.index("weighted_sum_kernel")
    assert "scores_kernel" not in [f.__name__ for f in ran.functions() if f.__module__ == "core.kernels.cpu"
                                   and ran.build_of(f) is not None]      # never seen running: read from code


def test_a_closure_or_a_comprehension_stands_for_the_function_it_is_written_in():
    listcomp = next(c for c in at.filter_bank.__code__.co_consts if hasattr(c, "co_qualname"))
    assert listcomp.co_qualname == "filter_bank.<locals>.<listcomp>"
    assert R._function_of(listcomp, vars(at)) is at.filter_bank
    assert R._function_of(at.attention.__code__, vars(at)) is at.attention
    assert R._function_of(dispatch.run.__code__, vars(dispatch)) is None            # the machinery
    assert R._function_of(test_a_closure_or_a_comprehension_stands_for_the_function_it_is_written_in.__code__,
                          globals()) is None                                       # not core's


def test_nothing_is_noted_outside_a_block_and_no_hook_stays_behind():
    assert sys.getprofile() is None
    recorded(at.attention)(*qkv())
    note(at.scores)
    assert sys.getprofile() is None
    with recording() as ran:
        with pytest.raises(ValueError):
            recorded(at.attention)(np.ones(3), np.ones(3), np.ones(3))     # refused inside the watch
        assert sys.getprofile() is None
    assert names(ran)[0] == "core.attention.attention"


def test_under_another_profiler_only_the_marked_function_is_noted():
    def other(frame, event, arg):
        pass

    sys.setprofile(other)
    try:
        with recording() as ran:
            recorded(at.attention)(*qkv())
        assert sys.getprofile() is other
    finally:
        sys.setprofile(None)
    assert names(ran) == ["core.attention.attention"] + [f"{f.__module__}.{f.__qualname__}"
                                                         for call in ran for f in call.host + call.kernels]


def test_each_function_once_in_the_order_first_run_and_blocks_share():
    with recording() as outer:
        note(at.scores)
        with recording() as inner:
            note(lesson_cpu.scores_kernel)          # compiled: noted as its source, with its build
            note(at.scores)
        note(at.attention)
    assert inner.functions() == [lesson_cpu.scores_kernel.py_func, at.scores]
    assert outer.functions() == [at.scores, lesson_cpu.scores_kernel.py_func, at.attention]
    assert outer.build_of(lesson_cpu.scores_kernel.py_func) is lesson_cpu.scores_kernel
    with recording(inner):                          # goes on filling an earlier record
        note(at.merge_heads)
    assert inner.functions()[-1] is at.merge_heads
    merged = Record()
    merged.merge(outer)
    assert merged.functions() == outer.functions()
    assert merged.build_of(lesson_cpu.scores_kernel.py_func) is lesson_cpu.scores_kernel


def test_a_closure_of_core_is_noted_as_the_function_it_is_written_in():
    """A training step's update is a closure: the source that holds it is its maker's."""
    update = loop.gradient_update(lambda *batch: 0.0, np.zeros(1), np.zeros(1), None)
    with recording() as ran:
        note(update)
    assert ran.functions() == [loop.gradient_update]


def test_a_bound_method_is_noted_as_its_function():
    class Step:
        def run(self):
            return 1

    with recording() as ran:
        note(Step().run)
        note(Step().run)
    assert ran.functions() == [Step.run]


def test_two_threads_recording_at_once_see_only_their_own_calls():
    """As two Streamlit sessions do: each thread's watch and record are its own."""
    Q, K, V = qkv(4)
    start = threading.Barrier(2)
    seen, errors = {}, []

    def session(fn):
        try:
            with recording() as ran:
                start.wait()
                for _ in range(20):
                    recorded(fn)(Q, K) if fn is at.scores else recorded(fn)(Q, K, V, return_weights=False)
            seen[fn.__name__] = names(ran)
        except Exception as err:       # re-raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=session, args=(fn,)) for fn in (at.scores, at.attention)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen["scores"][0] == "core.attention.scores" and "core.attention.attention" not in seen["scores"]
    assert "core.kernels.cpu.scaled_scores" in seen["scores"]
    assert seen["attention"][0] == "core.attention.attention" and "core.attention.scores" not in seen["attention"]
    assert "core.kernels.cpu.scaled_scores" not in seen["attention"]


def test_a_model_s_record_holds_its_computation_not_its_bookkeeping():
    """A forward pass's record lists the sublayers that computed the logits, not the input checks
    (check_...), the config's shape bookkeeping or the cache's name helpers that ran beside them."""
    from core.model import config, names, presets, transformer

    cfg = presets.gpt2(vocab_size=20, n_ctx=8, d_model=8, n_heads=2, n_layers=1)
    params = config.init_params(cfg, seed=0)
    with recording() as ran:
        recorded(transformer.forward)(params, cfg, np.arange(6))
    shown = {f"{f.__module__}.{f.__qualname__}" for f in ran.functions()}
    assert {"core.model.transformer.block", "core.model.multi_head.attend", "core.model.norms.layer_norm",
            "core.model.transformer.feed_forward"} <= shown
    bookkeeping = {f for f in shown if f.rsplit(".", 1)[-1].lstrip("_").startswith("check")
                   or f.startswith((config.__name__ + ".", names.__name__ + "."))}
    assert not bookkeeping, f"the record lists bookkeeping: {sorted(bookkeeping)}"
