"""A class of 30 on one server: ``python -m bench load [--sessions N]`` (or ``python -m bench load``).

Runs the load test (``tests/browser/test_load.py::test_class_of_students``) with ``N`` concurrent browser
sessions (30 by default; CI runs 10): between them every page; 5 train at once through the server's
training queue, 5 open "A real model" on all-MiniLM-L6-v2 and 5 on SmolLM2-135M-Instruct. Prints its
report: errors, peak resident memory of the server and its children, and per page the median and 95th-percentile redraw time under
that load twice over: as the browsers saw it, and the server's own run of the page (``ATTN_REDRAW_LOG``,
``ui/redraw_log.py``). The browsers stand for the students' machines: they run niced below the server,
so the figures measure the server rather than thirty browsers competing with it for the same cores.
Needs Chromium and Playwright, as the browser tests do.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    args = parser.parse_args(argv if argv is not None else [])
    env = dict(os.environ, LOAD_SESSIONS=str(args.sessions), REQUIRE_BROWSER="1")
    report = ROOT / "artifacts" / "load_test.txt"
    report.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s",
                           "tests/browser/test_load.py::test_class_of_students"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    print(f"## A class of {args.sessions} on one server (load test, {os.cpu_count()} cores)\n")
    print(report.read_text(encoding="utf-8") if report.exists() else proc.stdout[-12000:] + proc.stderr[-2000:])
    print("result:", "passed" if proc.returncode == 0 else f"failed (pytest exit status {proc.returncode})")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
