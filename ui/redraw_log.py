"""The server's own time for each page run, written only where ``ATTN_REDRAW_LOG`` names a file.

A load test sees a redraw from the browser's side: the server's work plus the network, the
browser's drawing and, on a small machine, the browsers' fight with the server for its cores. This
log is the server's side alone (one line per full page run: the page's address and seconds), so a
report can set the two side by side. Unset, it costs nothing.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

PATH = os.environ.get("ATTN_REDRAW_LOG")
_lock = threading.Lock()     # sessions run in threads of one process: one line at a time


@contextmanager
def timed(page: str):
    """Time the ``with`` block (a page's run) and append ``page<TAB>seconds`` to the log; a run
    cut short (``st.rerun``, a stop) is not a redraw and is not written."""
    start = time.perf_counter()
    yield
    if PATH:
        line = f"{page}\t{time.perf_counter() - start:.4f}\n"
        with _lock, open(PATH, "a", encoding="utf-8") as log:
            log.write(line)


def read(path: str) -> dict[str, list[float]]:
    """``{page: [seconds, ...]}`` from a log written by :func:`timed`."""
    runs: dict[str, list[float]] = {}
    with open(path, encoding="utf-8") as log:
        for line in log:
            page, seconds = line.rstrip("\n").split("\t")
            runs.setdefault(page, []).append(float(seconds))
    return runs
