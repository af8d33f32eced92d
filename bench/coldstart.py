"""Cold start and warm redraw of every page, as a student meets them.

Run as ``python -m bench.coldstart [--repeats N]`` (or ``python -m bench coldstart``); prints
Markdown tables:

1. a fresh process (``subprocess``) renders the router (``app.py``, its default page), then the
   first lesson page (``FIRST_LESSON_PAGE``), then every other page through ``AppTest``, once with
   an **empty** Numba cache (every kernel compiles) and once more with the cache that run left
   (**warm**: kernels load from disk). Times are from the process's start, and per page for its
   first render in that process. Target: the first lesson page drawn within ``TARGET_FIRST_LESSON_S``
   of the process's start with an empty cache;
2. the **warm redraw** of each page in this process: ``AppTest`` re-run after one widget change
   (the first slider, number input or toggle of the page), median of ``--repeats``. A page that
   measures kernels live (``MEASURING_PAGES``) times again whenever its sizes change; for it the
   plain rerun is timed, which keeps its measurement.

``python -m bench.coldstart --warm-only`` renders every page once (float64 and float32), trains a
few steps (and compiles the decoder's step), and exits: the Dockerfile runs it
at build time so that the image ships compiled kernels and the first student does not wait.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
FIRST_LESSON_PAGE = "views/one_head.py"   # the first page that computes, after the overview
TARGET_FIRST_LESSON_S = 5.0
MEASURING_PAGES = {"make_it_fast"}        # pages that time kernels whenever their sizes change


def page_files() -> list[str]:
    """The page files ``app.py`` lists, in order (read from its ``st.Page("...")`` calls)."""
    tree = ast.parse(APP.read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "attr", getattr(n.func, "id", None)) == "Page"
             and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]
    return [c.args[0].value for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def _name(path: str) -> str:
    return Path(path).stem


def warm_cache(timeout: float = 600) -> dict[str, float]:
    """Compile and cache what the pages run: every page in float64 and float32, a few training
    steps (the encoder's kernels) and the decoder's training step. Seconds per item."""
    from streamlit.testing.v1 import AppTest

    from core.models import decoder_step, training

    seconds = {}
    for precision in ("float64", "float32"):
        for path in page_files():
            start = time.perf_counter()
            at = AppTest.from_file(str(ROOT / path), default_timeout=timeout)
            at.session_state["precision_choice"] = precision    # ui.widgets.PRECISION_KEY
            at.run()
            seconds[f"{_name(path)} ({precision})"] = time.perf_counter() - start
            if at.exception:
                raise RuntimeError(f"{path} raised while warming up: {at.exception[0].message}")
    start = time.perf_counter()
    training.run("sum", steps=3, n_train=64, n_val=32, n_test=32, eval_every=1)
    seconds["training steps"] = time.perf_counter() - start
    start = time.perf_counter()
    decoder_step.warm_up()
    seconds["decoder training step"] = time.perf_counter() - start
    return seconds


def _child(started: float) -> None:
    """In a fresh process: the router and its default page, the first lesson page, then each other
    page's first render; JSON on stdout."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=600).run()
    first_page = time.time() - started
    errors = [e.message for e in at.exception]
    pages = {}
    for path in [FIRST_LESSON_PAGE] + [p for p in page_files() if p != FIRST_LESSON_PAGE]:
        start = time.perf_counter()
        at.switch_page(path).run()
        pages[_name(path)] = time.perf_counter() - start
        errors += [f"{path}: {e.message}" for e in at.exception]
        if path == FIRST_LESSON_PAGE:
            first_lesson = time.time() - started
    print(json.dumps({"first_page_s": first_page, "first_lesson_s": first_lesson,
                      "all_pages_s": time.time() - started, "pages": pages, "errors": errors}))


def _run_child(cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "bench.coldstart", "--child", repr(started)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _widgets(at) -> list:
    return list(at.main.slider) + list(at.main.number_input) + list(at.main.toggle)


def _first_control(at) -> tuple[int, list] | None:
    """(index in ``_widgets``, two values to alternate) for the page's first movable control."""
    for index, w in enumerate(_widgets(at)):
        if getattr(w, "disabled", False) or isinstance(w.value, tuple):
            continue
        if isinstance(w.value, bool):
            return index, [w.value, not w.value]
        step = w.step or 1
        other = w.value + step if w.max is None or w.value + step <= w.max else w.value - step
        if w.min is None or other >= w.min:
            return index, [w.value, type(w.value)(other)]
    return None


def redraw_ms(path: str, repeats: int) -> tuple[str, float]:
    """Median ms of an AppTest re-run of a warmed page after changing its first control."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / path), default_timeout=600).run()
    found = None if _name(path) in MEASURING_PAGES else _first_control(at)
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        if found is None:                       # nothing to move: time a plain rerun
            at.run()
        else:
            index, values = found
            _widgets(at)[index].set_value(values[(i + 1) % 2]).run()
        if i:                                   # the first change may still load a kernel
            times.append((time.perf_counter() - start) * 1e3)
        if at.exception:
            raise RuntimeError(f"{path} raised: {at.exception[0].message}")
    if found is None:
        label = "(plain rerun; keeps its measurement)" if _name(path) in MEASURING_PAGES else "(plain rerun)"
    else:
        label = _widgets(at)[found[0]].label
    return label, statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="redraws timed per page (median)")
    parser.add_argument("--warm-only", action="store_true", help="render every page once and exit")
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child is not None:
        _child(args.child)
        return {}
    if args.warm_only:
        seconds = warm_cache()
        print("warmed: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
        return seconds

    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache_dir:
        cold = _run_child(cache_dir)
        warm = _run_child(cache_dir)
    lesson = _name(FIRST_LESSON_PAGE)
    print("## Cold start (fresh process: router, the first lesson page, then every page through AppTest)\n")
    print(f"| Numba cache | router and overview drawn (s from process start) | first lesson page ({lesson}) "
          f"drawn (s from process start) | all pages rendered (s) |")
    print("|---|---|---|---|")
    print(f"| empty (every kernel compiles) | {cold['first_page_s']:.1f} | {cold['first_lesson_s']:.1f} "
          f"| {cold['all_pages_s']:.1f} |")
    print(f"| warm (kernels load from disk) | {warm['first_page_s']:.1f} | {warm['first_lesson_s']:.1f} "
          f"| {warm['all_pages_s']:.1f} |")
    met = "met" if cold["first_lesson_s"] < TARGET_FIRST_LESSON_S else "not met"
    print(f"\nTarget: the first lesson page within {TARGET_FIRST_LESSON_S:.0f} s of the process's start with an "
          f"empty Numba cache: {cold['first_lesson_s']:.1f} s, {met}.")
    for label, run in (("cold", cold), ("warm", warm)):
        for err in run["errors"]:
            print(f"\n{label} run error: {err}")

    warm_cache()                                   # this process: imports and kernels loaded
    print("\n## Each page: first render in a fresh process, and warm redraw\n")
    print("| page | first render, empty cache (s) | first render, warm cache (s) | control changed | "
          "warm redraw, median (ms) |")
    print("|---|---|---|---|---|")
    redraws = {}
    for path in page_files():
        name = _name(path)
        label, ms = redraw_ms(path, args.repeats)
        redraws[name] = ms
        print(f"| {name} | {cold['pages'].get(name, float('nan')):.2f} | {warm['pages'].get(name, float('nan')):.2f} "
              f"| {label[:40]} | {ms:.0f} |")
    return {"cold": cold, "warm": warm, "redraw_ms": redraws}


if __name__ == "__main__":
    main(sys.argv[1:])
