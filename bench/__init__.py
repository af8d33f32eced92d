"""Benchmarks, run as ``python -m bench``; and what the benchmarks share: timing a contender in a
process of its own, the PyTorch step probe, and alternating rounds."""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import textwrap
from typing import Callable

# Times PyTorch's training step (``torch_stepper(threads)`` of the module named first) on one fixed
# batch after a warm-up, in a process of its own: two OpenMP runtimes in one process, Numba's and
# PyTorch's, spin against each other and would time the contention.
_TORCH_PROBE = textwrap.dedent("""
    import importlib, json, sys, time
    module, (threads, warmup, steps) = sys.argv[1], (int(a) for a in sys.argv[2:5])
    step = importlib.import_module(module).torch_stepper(threads)
    for _ in range(warmup):
        step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    print(json.dumps({"ms_per_step": 1000 * (time.perf_counter() - t0) / steps,
                      "cpu_ms_per_step": 1000 * (time.process_time() - c0) / steps}))
""")


# A folder holding an earlier checkout of this project: its code runs as one more contender, "ours
# (before)", in the same alternating rounds, so that a change is measured against what it replaced.
BEFORE = os.environ.get("BENCH_OURS_BEFORE")


def in_tree(tree: str | None) -> dict:
    """``last_json_line``'s keywords that run a command on the code of ``tree`` (None: this checkout)."""
    return {} if tree is None else {"env": dict(os.environ, PYTHONPATH=tree), "cwd": tree}


def last_json_line(args: list[str], env: dict | None = None, cwd: str | None = None) -> dict:
    """Run ``python *args`` in a process of its own (environment ``env``, default this one with the
    working folder on the path; in the folder ``cwd``, which ``python -c`` puts first on the path);
    the last line it prints, read as JSON."""
    env = dict(os.environ, PYTHONPATH=os.getcwd()) if env is None else env
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def torch_step_ms(module: str, threads: int, warmup: int, steps: int) -> float:
    """PyTorch's wall milliseconds per step of ``module.torch_stepper`` at ``threads`` threads."""
    return last_json_line(["-c", _TORCH_PROBE, module, str(threads), str(warmup), str(steps)])["ms_per_step"]


def with_threads(ours: Callable[[], float], timed: Callable[[int], float], label: str, threads,
                 needs=("torch",)) -> dict[str, Callable[[], float]]:
    """The contenders: ``"ours"``, and ``"{label}, n thread(s)"`` timing ``timed(n)`` for each thread
    count, when every module in ``needs`` is installed (else ours alone)."""
    contenders = {"ours": ours}
    if all(importlib.util.find_spec(name) is not None for name in needs):
        contenders.update({f"{label}, {n} thread{'s' if n > 1 else ''}": (lambda n=n: timed(n)) for n in threads})
    return contenders


def alternating_rounds(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each contender's time in every round; the order alternates between rounds, so that load from
    other work on the machine hits every side alike."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(contenders[name]())
    return times


def print_step_table(times: dict[str, list[float]], ours_label: str) -> None:
    """A Markdown table of :func:`alternating_rounds`' milliseconds per step: each contender's best
    round, median and every round, and its best against ours."""
    ours = min(times["ours"])
    print("| implementation | best round, ms / step | median, ms / step | every round | best vs ours |")
    print("|---|---:|---:|---|---:|")
    for name, ms in times.items():
        label = ours_label if name == "ours" else f"{name} (own process)"
        print(f"| {label} | {min(ms):.2f} | {statistics.median(ms):.2f} | {', '.join(f'{t:.2f}' for t in ms)} "
              f"| {min(ms) / ours:.2f}x |")


def answered_app(path: str, timeout: float = 300):
    """An AppTest of the page at ``path`` in a session where every question of the app is answered
    (right, at the first try): the controls a page unlocks once its question is answered can be
    moved, as a student who has answered moves them."""
    from streamlit.testing.v1 import AppTest

    from core.lessons import questions
    from core.lessons.predictions import RIGHT, Progress
    from ui.lesson import PROGRESS

    at = AppTest.from_file(path, default_timeout=timeout)
    at.session_state[PROGRESS] = {q.key: Progress(1, True, True, RIGHT) for q in questions.everything()}
    return at
