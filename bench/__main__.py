"""Run every benchmark and print its tables: ``python -m bench [section ...]``.

Sections: attention, crossover, training, decoder, pages, coldstart, first_visit, real_model, load, gemm. Each prints
ratios measured side by side in one run; copy the output into ``bench/RESULTS.md`` together with the
machine it ran on.
"""
import importlib
import os
import platform
import sys

import numba
import numpy as np

SECTIONS = ["attention", "crossover", "training", "decoder", "pages", "coldstart", "first_visit", "real_model", "load",
            "gemm"]


def main(argv: list[str]) -> None:
    chosen = argv or SECTIONS
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    print(f"# Benchmarks\n\nPython {platform.python_version()}, NumPy {np.__version__}, Numba {numba.__version__}, "
          f"{platform.machine()}, {numba.config.NUMBA_NUM_THREADS} CPU threads available\n")
    for name in chosen:
        # Other work on the machine slows every figure, multi-threaded ones most (a parallel region
        # waits for its slowest thread): say how busy the machine was around each section.
        print(f"(load average before this section: {_load()}; {os.cpu_count()} CPUs)\n")
        importlib.import_module(f"bench.{name}").main()
        print(f"\n(load average after this section: {_load()})\n")


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " over 1, 5, 15 minutes"


if __name__ == "__main__":
    main(sys.argv[1:])
