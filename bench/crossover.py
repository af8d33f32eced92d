"""Where the tuned kernels overtake the lesson ones, per operation: the sizes behind ``TUNED_FROM``.

Each operation's host driver runs, float32, from the lesson kernels and from the tuned ones (their
serial builds at these sizes), at growing sizes, alternating the two.
The crossover is the smallest work (multiply-adds, as the dispatch counts it) from which the tuned
track was the faster at that size and every larger one measured; copy it into
``core/kernels/dispatch.py``'s ``TUNED_FROM``.

Run: ``python -m bench crossover``.
"""
from __future__ import annotations

import numpy as np

from bench.attention import median_seconds
from core import masks
from core.kernels import cpu as lesson_cpu
from core.kernels import dispatch
from core.kernels.tuned import cpu as tuned_cpu

ROUNDS = 5
DTYPE = np.float32


def _cases():
    """``(operation, work, arguments)`` at growing sizes: attention with H = 4 heads of d_k = d_v = 4
    (causal), projections into 4 heads, positional codes. Only sizes the tuned kernels run serially
    (their parallel builds start at ``PARALLEL_MIN_WORK``, far above any crossover): on a busy
    machine a parallel region waits for a descheduled thread, which would time the scheduler."""
    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.standard_normal(shape).astype(DTYPE)   # noqa: E731
    for T in (2, 4, 6, 8, 12, 16, 20, 24, 32):
        H, d = 4, 4
        Q, K, V, mask = rand(1, H, T, d), rand(1, H, T, d), rand(1, H, T, d), masks.causal(T, DTYPE)[None, None]
        scale = DTYPE(0.5)
        work = H * T * T * 2 * d
        yield "attention_with_weights", work, (Q, K, V, mask, scale)
        yield "fused_attention", work, (Q, K, V, mask, scale)
        yield "scaled_scores", work // 2, (Q, K, mask, scale)
        yield "weighted_sum", work // 2, (np.full((1, H, T, T), 1 / T, DTYPE), V)
    for T, d in ((4, 4), (8, 8), (16, 16), (32, 32), (64, 32), (64, 64), (128, 32), (128, 64)):
        W, b = rand(d, d), np.zeros(d, DTYPE)
        yield "project_heads", T * d * d, (rand(1, T, d), W, b, 4)
        yield "merge_heads_project", T * d * d, (rand(1, 4, T, d // 4), W, b)
    for T, d in ((8, 8), (16, 16), (32, 32), (64, 32), (64, 64), (128, 64), (128, 128), (256, 128), (512, 128)):
        yield "sinusoidal", T * d, (T, d, 10000.0, np.dtype(DTYPE))


def _serial(op: str, work: int) -> bool:
    """Whether the tuned driver runs its serial build at this work: its own count is 16 per entry for the
    sinusoid and (d_k + d_v + 8) per weight for attention, twice the dispatch's here."""
    factor = {"sinusoidal": 16, "attention_with_weights": 2, "fused_attention": 2}.get(op, 1)
    return work * factor < tuned_cpu.PARALLEL_MIN_WORK


def _time(op: str, args: tuple, track: str) -> float:
    driver = getattr(lesson_cpu if track == "lesson" else tuned_cpu, op)
    return median_seconds(lambda: driver(*args), budget=0.05, repeats=5)


def measure() -> dict[str, list[tuple[int, float, float]]]:
    """``{operation: [(work, lesson seconds, tuned seconds), ...]}``, each the fastest of ``ROUNDS``
    alternating rounds (the host drivers called directly: the public API's checks cost both alike)."""
    cases = list(_cases())
    best: dict[tuple[str, int], list[float]] = {}
    cases = [(op, work, args) for op, work, args in cases if _serial(op, work)]
    for _ in range(ROUNDS):
        for op, work, args in cases:
            times = (_time(op, args, "lesson"), _time(op, args, "tuned"))
            old = best.get((op, work), [np.inf, np.inf])
            best[(op, work)] = [min(a, b) for a, b in zip(old, times)]
    table: dict[str, list] = {}
    for (op, work), (lesson, tuned) in sorted(best.items()):
        table.setdefault(op, []).append((work, lesson, tuned))
    return table


def crossover(rows: list[tuple[int, float, float]]) -> int | None:
    """The smallest work from which the tuned time is at most the lesson time at every size measured
    (None when the tuned track never stays ahead)."""
    found = None
    for work, lesson, tuned in reversed(rows):
        if tuned > lesson:
            break
        found = work
    return found


def main() -> None:
    table = measure()
    print("## Crossover: lesson against tuned kernels (float32, host drivers, fastest of "
          f"{ROUNDS} alternating rounds)\n")
    print("| operation | work (multiply-adds) | lesson µs | tuned µs | lesson / tuned |")
    print("|---|---|---|---|---|")
    for op, rows in table.items():
        for work, lesson, tuned in rows:
            print(f"| {op} | {work:,} | {lesson * 1e6:.1f} | {tuned * 1e6:.1f} | {lesson / tuned:.2f}x |")
    print("\nCrossover (tuned from this work on), and what `dispatch.TUNED_FROM` holds:\n")
    print("| operation | measured crossover | TUNED_FROM |")
    print("|---|---|---|")
    for op, rows in table.items():
        found = crossover(rows)
        print(f"| {op} | {'never within the sizes measured' if found is None else f'{found:,}'} "
              f"| {dispatch.TUNED_FROM[op]:,} |")


if __name__ == "__main__":
    main()
