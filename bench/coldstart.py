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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
FIRST_LESSON_PAGE = "views/one_head.py"   # the first page that computes, after the overview
FIRST_MODEL_PAGE = "views/inside_model.py"  # a trained model's walkthrough, opened first by its link
TARGET_FIRST_LESSON_S = 5.0
TARGET_PAGE_S = 5.0                       # every page but Make it fast, drawn this soon after it is opened
TARGET_ALL_PAGES_S = 60.0                 # every page in turn, from the process's start
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
    """Compile and cache what the pages run: every step of the server's warm-up (Make it fast's
    kernels included), every page in float64 and float32, a few training steps (the encoder's
    kernels) and the decoder's training step. Seconds per item."""
    from streamlit.testing.v1 import AppTest

    from core import warmup
    from core.model.tuned import decoder_loss
    from core.training import encoder_runs

    warm = warmup.WarmUp(warmup.STEPS, warmup.ON_DEMAND)
    for label, _, _ in warmup.ON_DEMAND:
        warm.want(label)
    warm.start().wait(timeout * 4)
    if warm.errors:
        raise RuntimeError("the warm-up failed: " + "; ".join(warm.errors))
    seconds = {f"warm-up: {label}": s for label, s in warm.seconds.items()}
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
    encoder_runs.run("sum", steps=3, n_train=64, n_val=32, n_test=32, eval_every=1)
    seconds["training steps"] = time.perf_counter() - start
    start = time.perf_counter()
    decoder_loss.warm_up()
    seconds["decoder training step"] = time.perf_counter() - start
    return seconds


def _child(started: float, first: str) -> None:
    """In a fresh process, as a server meets its first student: the router and its default page,
    then ``first``, then each other page's first render; JSON on stdout. The background warm-up
    runs as on a server (``app.py`` starts it); what each page says it ran is recorded."""
    from streamlit.testing.v1 import AppTest

    from core import warmup

    at = AppTest.from_file(str(APP), default_timeout=600).run()
    first_page = time.time() - started
    errors = [e.message for e in at.exception]
    pages, tracks = {}, {}
    loaded = {}                                  # when the warm-up had loaded everything it compiles
    threading.Thread(target=lambda: warmup.start_once().wait(1800) and loaded.setdefault("s", time.time() - started),
                     daemon=True).start()
    for path in [first] + [p for p in page_files() if p != first]:
        start = time.perf_counter()
        at.switch_page(path).run()
        pages[_name(path)] = time.perf_counter() - start
        errors += [f"{path}: {e.message}" for e in at.exception]
        said = " ".join(f"{getattr(m, 'value', '')} {getattr(m, 'label', '')}" for m in (*at.caption, *at.metric))
        tracks[_name(path)] = " and ".join(word for word in ("shipped", "readable") if word in said)
        if path == first:
            first_opened = time.time() - started
    all_pages = time.time() - started
    warmup.start_once().wait(1800)
    time.sleep(0.1)
    print(json.dumps({"first_page_s": first_page, "first_lesson_s": first_opened, "all_pages_s": all_pages,
                      "pages": pages, "tracks": tracks, "errors": errors + warmup.start_once().errors,
                      "compiled_s": loaded.get("s", float("nan")), "steps_s": warmup.start_once().seconds}))


def _run_child(cache_dir: str, first: str = FIRST_LESSON_PAGE) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "ATTN_WARMUP")}
    env.update(NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "bench.coldstart", "--child", repr(started), "--first", first],
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
    parser.add_argument("--profile", action="store_true",
                        help="also compile every warm-up step on an empty cache and print what the time goes to")
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--first", default=FIRST_LESSON_PAGE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child is not None:
        _child(args.child, args.first)
        return {}
    if args.warm_only:
        seconds = warm_cache()
        print("warmed: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
        return seconds

    from bench.attention import _cpu_model

    print(f"CPU: {_cpu_model()}, {os.cpu_count()} cores\n")
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache_dir:
        cold = _run_child(cache_dir)
        warm = _run_child(cache_dir)
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache_dir:
        model_first = _run_child(cache_dir, FIRST_MODEL_PAGE)
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
    slow = {name: s for name, s in cold["pages"].items() if s >= TARGET_PAGE_S and name not in MEASURING_PAGES}
    print(f"Target: every page but Make it fast drawn within {TARGET_PAGE_S:.0f} s of being opened, empty cache: "
          + ("met" if not slow else "not met: " + ", ".join(f"{n} {s:.1f} s" for n, s in slow.items()))
          + f". Every page within {TARGET_ALL_PAGES_S:.0f} s of the start: {cold['all_pages_s']:.1f} s, "
          + ("met." if cold["all_pages_s"] < TARGET_ALL_PAGES_S else "not met."))
    print(f"\nEvery kernel compiled and loaded (the warm-up finished, every page by then on its compiled "
          f"track): {cold['compiled_s']:.0f} s after the start with an empty cache, {warm['compiled_s']:.0f} s with "
          f"a warm one. Each step, empty cache: "
          + ", ".join(f"{label} {s:.0f} s" for label, s in cold["steps_s"].items()) + ".")
    model = _name(FIRST_MODEL_PAGE)
    print(f"\n{model} opened first by its link (a fresh process, an empty cache): drawn {model_first['first_lesson_s']:.1f} s "
          f"after the start ({model_first['pages'][model]:.1f} s after it was opened), "
          f"{'its model ' + model_first['tracks'][model] + ' (the page says so)' if model_first['tracks'][model] else 'on the compiled track'}.")
    for label, run in (("cold", cold), ("warm", warm), (f"{model} first", model_first)):
        for err in run["errors"]:
            print(f"\n{label} run error: {err}")

    warm_cache()                                   # this process: imports and kernels loaded
    print("\n## Each page: first render in a fresh process, and warm redraw\n")
    print("| page | first render, empty cache (s) | track it said it ran, empty cache | first render, warm cache (s) "
          "| control changed | warm redraw, median (ms) |")
    print("|---|---|---|---|---|---|")
    redraws = {}
    for path in page_files():
        name = _name(path)
        label, ms = redraw_ms(path, args.repeats)
        redraws[name] = ms
        print(f"| {name} | {cold['pages'].get(name, float('nan')):.2f} | {cold['tracks'].get(name) or '–'} "
              f"| {warm['pages'].get(name, float('nan')):.2f} | {label[:40]} | {ms:.0f} |")
    if args.profile:
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache_dir:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT))
            print("\n## What the background compile spends its time on (every step, one process, empty cache)\n")
            print(subprocess.run([sys.executable, "-m", "core.warmup", "--profile", "30"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=1800).stdout)
    return {"cold": cold, "warm": warm, "model_first": model_first, "redraw_ms": redraws}


if __name__ == "__main__":
    main(sys.argv[1:])
