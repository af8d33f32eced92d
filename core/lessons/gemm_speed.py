"""A matrix product made fast, step by step: the numbers of the "Make it fast" page's last section.

One product ``y = x W``, float32, as a linear layer of a real model computes it: ``x`` (M, K) holds
M tokens' activations, ``W`` (K, N) the layer's weight. It is timed five ways, each a step on the
way from the loops of the definition to our own product (:mod:`core.kernels.tuned.gemm`):

- ``"naive loops"``: :func:`core.kernels.matmul.matmul_kernel`, one output number at a time;
- ``"register tile"``: :func:`core.model.tuned.products.project`, 4 rows by 3 or 4 SIMD vectors of
  sums held in registers, reading ``W``'s own rows where they lie (one core);
- ``"packed panels, one core"``: :func:`core.kernels.tuned.gemm.matmul` on ``W`` packed once into
  panels of one tile's columns, Numba held to one thread (for the calling thread only);
- ``"packed panels, both cores"``: the same at Numba's default thread count;
- ``"NumPy's BLAS"``: ``x @ W``, handed ``W`` as it is at every call.

Every result is checked against NumPy's float64 product before it is timed: a step that computes
something else raises. The work is ``2 M K N`` flops (``M N`` dot products of length ``K``, a
multiply and an add each) and the speeds are read against the machine's sgemm ceiling
(:func:`core.lessons.speed.sgemm_gflops`), as the attention timings above them are.

Nothing here imports Streamlit: the page draws what these functions return.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import numpy as np

from core.kernels import matmul as readable
from core.kernels.tuned import gemm
from core.lessons import speed
from core.model.tuned import products

DTYPE = np.float32


@dataclass(frozen=True)
class Shape:
    """One product to time: ``x`` (M, K) by ``W`` (K, N), named after the layer that computes it."""

    name: str
    M: int
    K: int
    N: int

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.M, self.K, self.N

    @property
    def label(self) -> str:
        return f"{self.name}, {self.M} × {self.K} × {self.N}"


# The real models' linear layers, M tokens at a time, and a square product; keyed for the page's link.
SHAPES = {
    "minilm-qkv": Shape("all-MiniLM-L6-v2 QKV", 128, 384, 1152),
    "gpt2-ffn": Shape("GPT-2 feed-forward", 64, 768, 3072),
    "smollm2-ffn": Shape("SmolLM2 feed-forward", 64, 576, 1536),
    "square-512": Shape("square", 512, 512, 512),
}
ALL_THREADS = numba.config.NUMBA_NUM_THREADS     # Numba's default: one thread per CPU it was given
STEPS = ("naive loops", "register tile", "packed panels, one core",
         "packed panels, both cores" if ALL_THREADS == 2 else f"packed panels, {ALL_THREADS} threads",
         "NumPy's BLAS")
NAIVE, TILE, PACKED_ONE, PACKED_ALL, BLAS = STEPS
# The naive loops' call is predicted from a trial run on this many rows of x (the same K and N, so
# each row is the same work in the same memory order): at 64 x 768 x 3072 it takes a good part of
# a second on two cores, and a busy machine could make it several.
PROBE_ROWS = 4


# --- the arithmetic ------------------------------------------------------------------------------


def matmul_flops(M: int, K: int, N: int) -> int:
    """``2 M K N``: ``M N`` dot products of length ``K``, a multiply and an add each."""
    return 2 * M * K * N


def inputs(M: int, K: int, N: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded float32 ``x`` (M, K) and ``W`` (K, N), standard normal."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(DTYPE), rng.standard_normal((K, N)).astype(DTYPE)


def check_product(step: str, y: np.ndarray, x: np.ndarray, W: np.ndarray) -> None:
    """Raise ``ValueError`` unless ``y`` is ``x @ W`` to float32's rounding.

    Each float32 sum of ``K`` products is within ``K eps |x| |W|`` of the exact one, whatever the
    order it is added in (the classical bound, with float32's ``eps = 2^-23``); NumPy's float64
    product stands in for the exact one (its own error is 2^29 times smaller)."""
    if y.shape != (x.shape[0], W.shape[1]) or y.dtype != DTYPE:
        raise ValueError(f"{step} returned a {y.dtype} array of shape {y.shape}, not float32 "
                         f"{(x.shape[0], W.shape[1])}.")
    x64, W64 = x.astype(np.float64), W.astype(np.float64)
    exact = x64 @ W64
    bound = x.shape[1] * np.finfo(DTYPE).eps * (np.abs(x64) @ np.abs(W64))
    wrong = ~(np.abs(y - exact) <= bound)             # NaN is wrong too
    if wrong.any():
        i, j = np.argwhere(wrong)[0]
        raise ValueError(f"{step} computed a wrong product: y[{i}, {j}] = {y[i, j]:.6g} where x @ W is "
                         f"{exact[i, j]:.6g} (float32's rounding allows {bound[i, j]:.2g} off).")


# --- the steps -----------------------------------------------------------------------------------


@contextmanager
def numba_threads(n: int) -> Iterator[None]:
    """Numba's parallel loops called from this thread use ``n`` threads during the block.

    ``numba.set_num_threads`` sets a thread-local mask (Numba's "Notes on the threading
    implementation": each thread keeps its own in thread-local storage), so another session's
    thread of this server keeps its own count; the caller's count is restored after."""
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def on_threads(n: int, fn: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """``fn`` run on ``n`` of Numba's threads at each call (:func:`numba_threads`)."""
    def call() -> np.ndarray:
        with numba_threads(n):
            return fn()
    return call


def step_call(step: str, x: np.ndarray, W: np.ndarray, packed: gemm.PackedWeight) -> Callable[[], np.ndarray]:
    """A no-argument function that computes ``x @ W`` (a new array) the way ``step`` does.

    ``packed`` is ``gemm.pack(W)``: packed once before timing, as a model's weights are at load."""
    M, N = x.shape[0], W.shape[1]
    if step == NAIVE:
        no_bias = np.zeros(N, DTYPE)

        def naive() -> np.ndarray:
            y = np.empty((M, N), DTYPE)
            readable.matmul_kernel(x, W, no_bias, 0, y)
            return y
        return naive
    if step == TILE:
        A = x.T                                     # project computes Y = A^T X: A[k, m] = x[m, k]

        def tile() -> np.ndarray:
            y = np.empty((M, N), DTYPE)
            products.project(A, W, y, y, False)
            return y
        return tile
    if step == PACKED_ONE:
        return on_threads(1, lambda: gemm.matmul(x, packed))
    if step == PACKED_ALL:
        return on_threads(ALL_THREADS, lambda: gemm.matmul(x, packed))
    if step == BLAS:
        return lambda: x @ W
    raise ValueError(f"Unknown step {step!r}; choose one of {', '.join(STEPS)}.")


def warm_up() -> None:
    """Compile (or load from the disk cache) every step's kernel for float32, on a small product, and
    start NumPy's threads: no time measured then includes a compile or a cold start."""
    x, W = inputs(8, 16, 80)
    packed = gemm.pack(W)
    for step in STEPS:
        step_call(step, x, W, packed)()
    speed.sgemm_gflops(n=256)


# --- one run of the section ----------------------------------------------------------------------


@dataclass(frozen=True)
class StepTiming:
    """One step computing ``x @ W`` at (M, K, N), with the fields :func:`core.lessons.speed.busy_reasons`
    reads of a row of the attention table."""

    step: str
    M: int
    K: int
    N: int
    seconds: float                    # NaN when skipped
    note: str = ""                    # why it was skipped, in words
    passes: tuple[float, ...] = ()    # the time of each pass that ran it; ``seconds`` is the fastest

    @property
    def flops(self) -> int:
        return matmul_flops(self.M, self.K, self.N)

    @property
    def gflops(self) -> float:
        return speed.gflops_per_second(self.flops, self.seconds)

    @property
    def skipped(self) -> bool:
        return not self.seconds > 0

    @property
    def spread(self) -> float:
        """Slowest pass over fastest: 1 when they agree (or one pass ran it)."""
        return max(self.passes) / min(self.passes) if len(self.passes) > 1 and min(self.passes) > 0 else 1.0


def speed_up(row: StepTiming, rows: list[StepTiming]) -> float:
    """How many times faster ``row`` ran than the naive loops; NaN when either was not run."""
    naive = next((r for r in rows if r.step == NAIVE), None)
    if naive is None or naive.skipped or row.skipped:
        return math.nan
    return naive.seconds / row.seconds


def probe_seconds(x: np.ndarray, W: np.ndarray, rows: int = PROBE_ROWS) -> float:
    """The naive loops' predicted seconds for ``x @ W``: a trial run on ``rows`` rows of ``x`` (each
    row the same work), the best of three short rounds, scaled to ``x``'s rows."""
    part = np.ascontiguousarray(x[:rows])
    seconds = speed.best_seconds(step_call(NAIVE, part, W, None), repeats=3, budget_s=0.03)
    return seconds * x.shape[0] / part.shape[0]


def predicted_over_cap(x: np.ndarray, W: np.ndarray, call_cap_s: float, probes: int, pause_s: float) -> str:
    """Why the naive loops' call is skipped ("" when it is not): it is predicted over ``call_cap_s`` by
    every one of ``probes`` trial runs, ``pause_s`` apart (one slow moment skips nothing: the rule of
    :func:`core.lessons.speed.measure`)."""
    predicted = math.inf
    for trial in range(probes):
        if trial:
            time.sleep(pause_s)                       # let a burst of other work pass
        predicted = min(predicted, probe_seconds(x, W))
        if predicted <= call_cap_s:
            return ""
    return (f"skipped: predicted about {predicted:.1f} s per call, over the {call_cap_s:g} s limit (the fastest "
            f"of {probes} trial runs on {min(PROBE_ROWS, x.shape[0])} of the {x.shape[0]} rows)")


def measure(shape: tuple[int, int, int], *, budget_s: float = 0.15, call_cap_s: float = speed.CALL_CAP_S,
            passes: int = 2, probes: int = speed.PROBES, pause_s: float = speed.REPROBE_PAUSE_S,
            progress: Callable[[float, str], None] | None = None) -> list[StepTiming]:
    """Time every step on ``x @ W`` at ``shape`` = (M, K, N): one :class:`StepTiming` per step, in
    ``STEPS`` order.

    Each step's result is checked against NumPy's float64 product first (:func:`check_product`: a
    wrong step raises). Every step is timed in each of ``passes`` passes (``budget_s / passes``
    each) and keeps its fastest. The naive loops are not run when their call is predicted over
    ``call_cap_s`` (:func:`predicted_over_cap`): their row then has NaN seconds and a note.
    ``progress(fraction, text)`` is called before each step.
    """
    M, K, N = shape
    x, W = inputs(M, K, N)
    packed = gemm.pack(W)                              # once, as a model's weights at load: not timed
    calls = {step: step_call(step, x, W, packed) for step in STEPS}
    skip = predicted_over_cap(x, W, call_cap_s, probes, pause_s)
    run = [step for step in STEPS if not (step == NAIVE and skip)]
    for step in run:
        check_product(step, calls[step](), x, W)
    times: dict[str, list[float]] = {}
    for done in range(passes):
        for i, step in enumerate(run):
            if progress:
                progress((done * len(run) + i) / (passes * len(run)), f"{step} (pass {done + 1} of {passes})")
            times.setdefault(step, []).append(speed.best_seconds(calls[step], budget_s=budget_s / passes))
    if progress:
        progress(1.0, "done")
    return [StepTiming(step, M, K, N, min(times.get(step, [math.nan])), skip if step == NAIVE else "",
                       tuple(times.get(step, ()))) for step in STEPS]


@dataclass(frozen=True)
class Measurement(speed.Measurement):
    """One run of the section: every step's timing (``rows``), the sgemm ceiling, and whether to
    trust them; as the attention section's, but for its share of the ceiling."""

    def share(self, row: StepTiming) -> float:
        """``row``'s GFLOP/s as a percentage of the ceiling; NaN when the row was not run or the machine
        was busy. Over 100 is a result here: the ceiling is NumPy's BLAS on one large product, not
        the cores' peak, and our packed product can run faster at a model's shapes."""
        if self.busy or row.skipped or not self.ceiling > 0:
            return math.nan
        return 100.0 * row.gflops / self.ceiling


def measure_against_ceiling(shape: tuple[int, int, int], *, progress: Callable[[float, str], None] | None = None,
                            **options) -> Measurement:
    """:func:`measure` between two readings of the sgemm ceiling, and the verdict on the machine.

    The ceiling is the faster reading. ``busy`` gives the reasons of
    :func:`core.lessons.speed.busy_reasons` but one: readings of the ceiling far apart or far below
    the fastest this server has measured, and passes that disagree. A step faster than the ceiling
    is no sign of a busy machine here (our packed product can be), so the ceiling is not measured
    again for it. ``options`` go to :func:`measure`.
    """
    readings = [speed.sgemm_gflops()]
    rows = measure(shape, progress=progress, **options)
    readings.append(speed.sgemm_gflops())
    ceiling = max(readings)
    before = speed._fastest_ceiling["gflops"]       # one record of the machine per server, shared with attention's
    speed._fastest_ceiling["gflops"] = max(before, ceiling)
    # the ceiling's readings judged alone (no rows), then the rows' passes alone (no ceiling to beat)
    busy = speed.busy_reasons([], readings, ceiling, before) + speed.busy_reasons(rows, (), math.inf)
    return Measurement(rows, ceiling, tuple(readings), busy)


# --- what each step runs, as source --------------------------------------------------------------
STEP_FUNCTIONS = {
    NAIVE: [(readable, "matmul_kernel")],
    TILE: [(products, "project"), (gemm, "tile4" if gemm.TILE_VECTORS == 4 else "tile3")],
    PACKED_ONE: [(gemm, "pack"), (gemm, "_matmul")],
    PACKED_ALL: [(gemm, "_matmul")],
    BLAS: [],                                       # compiled C: NumPy's BLAS has no Python source
}


def sources(step: str) -> list[tuple[str, str]]:
    """``[(qualified name, source), ...]`` of the functions ``step`` runs (none for NumPy's BLAS)."""
    return [(f"{module.__name__}.{name}", speed.source_of(getattr(module, name)))
            for module, name in STEP_FUNCTIONS[step]]
