"""A fresh server's first visit: ``python -m bench first_visit [--visits N] [--page NAME]``.

Each visit starts a server of its own on an empty Numba cache (a new ``NUMBA_CACHE_DIR``, as a fresh
clone has it; the warm-up on, as a deployed server runs) and opens one page first, by its link, in
Chromium (Playwright, as the browser tests use it). The clock runs from the page's opening until it
is idle: the script has run, every element is drawn (none still waiting for its script) and nothing
runs. The browser runs niced below the server, as a student's runs on a machine of its own. Prints
each visit with the server's own run of the page (``ATTN_REDRAW_LOG``) and the median against the
target. Needs Chromium and Playwright.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))           # the browser tests' server and Chromium helpers

from browser_support import (IDLE_JS, StreamlitServer, chromium_or_skip, discover_pages,  # noqa: E402
                             error_texts, launch_options, wait_idle)
from ui import redraw_log  # noqa: E402

TARGET_S = 5.0              # a page opened first on a fresh server, drawn this soon
GUARD_MS = 300_000          # a visit that has not ended by then has hung


def visit(page_name: str) -> tuple[float, float, list[str]]:
    """One fresh server and one first visit: ``(seconds until idle, the server's run of the page,
    the error messages the page shows)``."""
    from playwright.sync_api import sync_playwright

    page_info = {p.name: p for p in discover_pages()}[page_name]
    with tempfile.TemporaryDirectory() as cache:
        log = Path(cache) / "redraws.log"
        with StreamlitServer(numba_cache_dir=cache, extra_env={"ATTN_REDRAW_LOG": str(log)}) as server, \
                sync_playwright() as pw:
            browser = pw.chromium.launch(**launch_options(chromium_or_skip()))
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            start = time.perf_counter()
            page.goto(server.page_url(page_info), timeout=GUARD_MS)
            page.wait_for_function(IDLE_JS, timeout=GUARD_MS, polling=50)
            seconds = time.perf_counter() - start
            wait_idle(page, timeout_ms=GUARD_MS)         # and it stays so: no second run follows
            errors = error_texts(page)
            browser.close()
        runs = redraw_log.read(str(log)).get(page_info.url_path or "home", [float("nan")])
    return seconds, runs[0], errors


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, default=3)
    parser.add_argument("--page", default="real_model", help="the page's file name in views/, without .py")
    args = parser.parse_args(argv if argv is not None else [])
    print(f"## /{args.page} opened first on a fresh server (empty compile cache), {os.cpu_count()} cores\n")
    print("| visit | drawn after (s) | the server's run of the page (s) | errors on the page |")
    print("|---:|---:|---:|---|")
    drawn = []
    for i in range(args.visits):
        seconds, server_s, errors = visit(args.page)
        drawn.append(seconds)
        print(f"| {i + 1} | {seconds:.2f} | {server_s:.2f} | {'; '.join(errors) or 'none'} |")
    median = statistics.median(drawn)
    print(f"\nmedian {median:.2f} s (target {TARGET_S:.0f} s: {'met' if median < TARGET_S else 'NOT met'})")
    return drawn


if __name__ == "__main__":
    main(sys.argv[1:])
