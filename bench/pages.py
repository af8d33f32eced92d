"""Warm redraw time of the lesson pages after one widget change (AppTest, median of repeats).

Run as ``python -m bench.pages [--repeats N]``; prints a Markdown table. Target: under 100 ms on
the lesson pages, under 300 ms on the other pages (training runs aside: they show progress).
Each page is drawn once first (imports, kernels compiled or loaded from the disk cache, first
draw), then one control is moved back and forth; each redraw is timed from the change to the end
of the page's run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


from bench import answered_app

PAGES = Path(__file__).resolve().parents[1] / "views"
# (page, query parameters of the link it opens with, what is changed, widget kind, key, two values, target ms)
CASES = [
    ("one_head", {}, "temperature τ", "slider", "one_head.temperature", (0.5, 1.5), 100),
    ("one_head", {}, "random seed", "number_input", "one_head.seed", (1, 2), 100),
    ("multi_head", {"H": "4"}, "gain of head 1", "slider", "multi_head.g1", (5.0, 6.0), 100),
    ("multi_head", {"H": "8"}, "gain of head 1", "slider", "multi_head.g1", (5.0, 6.0), 100),
    ("multi_head", {}, "query row t (impulse responses)", "slider", "multi_head.row", (3, 4), 100),
    ("filter_bank", {}, "gain of head 1", "slider", "filter_bank.gain", (2.0, 3.0), 100),
    ("parameters", {}, "d_model", "slider", "parameters.d_model", (128, 64), 300),
    ("positional", {}, "positions asked of a learned table", "number_input", "positional.asked", (300, 1024), 300),
    ("inside_model", {}, "test example", "number_input", "inside_model.example", (1, 0), 300),
    ("inside_model", {}, "layer", "slider", "inside_model.layer", (2, 1), 300),
    ("induction", {}, "held-out sequence", "slider", "induction.example", (1, 0), 300),
    ("induction", {}, "head", "radio", "induction.head", (2, 1), 300),
    ("decoder", {}, "generation step", "slider", "decoder.step", (2, 1), 300),
    ("decoder", {}, "temperature", "number_input", "decoder.temperature", (0.5, 1.0), 300),
]


def redraw_ms(page: str, link: dict, kind: str, key: str, values: tuple, repeats: int) -> float:
    """Median milliseconds of a re-run after setting the widget ``key`` to each of ``values`` in turn."""
    at = answered_app(str(PAGES / f"{page}.py"), timeout=120)
    for name, value in link.items():
        at.query_params[name] = value
    at.run()                                            # warm-up: imports, JIT, first draw
    getattr(at, kind)(key=key).set_value(values[1]).run()
    times = []
    for i in range(repeats):
        widget = getattr(at, kind)(key=key)
        start = time.perf_counter()
        widget.set_value(values[i % 2]).run()
        times.append((time.perf_counter() - start) * 1e3)
        if at.exception:
            raise RuntimeError(f"{page} raised: {at.exception[0].message}")
    return statistics.median(times)


def main(argv=None) -> list[tuple[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv if argv is not None else [])   # python -m bench passes none
    print(f"## Page redraws (warm, AppTest, median of {args.repeats})\n")
    print("| page | link | widget changed | median warm redraw (ms) | target |")
    print("|---|---|---|---|---|")
    rows = []
    for page, link, label, kind, key, values, target in CASES:
        ms = redraw_ms(page, link, kind, key, values, args.repeats)
        rows.append((page, ms))
        shown = ", ".join(f"{k}={v}" for k, v in link.items()) or "default"
        print(f"| {page} | {shown} | {label} | {ms:.1f} | {'ok' if ms < target else 'over'} < {target} |")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
