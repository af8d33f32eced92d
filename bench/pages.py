"""Warm redraw time of the multi-head page after one widget change (AppTest, median of repeats).

Run as ``python -m bench.pages [--repeats N]``; prints a Markdown table. Target: under 300 ms.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "multi_head.py")
TARGET_MS = 300.0


def redraw_ms(n_heads: int, repeats: int) -> float:
    """Median milliseconds of a re-run after moving head 1's gain, the page warmed up first."""
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params["H"] = str(n_heads)
    at.run()                                            # warm-up: imports, JIT, first draw
    at.slider(key="multi_head.g1").set_value(4.0).run()
    times = []
    for i in range(repeats):
        slider = at.slider(key="multi_head.g1")
        start = time.perf_counter()
        slider.set_value(5.0 if i % 2 else 6.0).run()
        times.append((time.perf_counter() - start) * 1e3)
        if at.exception:
            raise RuntimeError(f"the page raised: {at.exception[0].message}")
    return statistics.median(times)


def main(argv=None) -> list[tuple[int, float]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    rows = [(h, redraw_ms(h, args.repeats)) for h in (4, 8)]
    print("| page | H | widget changed | median warm redraw (ms) | target |")
    print("|---|---|---|---|---|")
    for h, ms in rows:
        print(f"| multi_head | {h} | gain of head 1 | {ms:.1f} | {'ok' if ms < TARGET_MS else 'over'} < {TARGET_MS:.0f} |")
    return rows


if __name__ == "__main__":
    main()
