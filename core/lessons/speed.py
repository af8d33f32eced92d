"""Timing attention three ways, and what the machine could do: the numbers of the "Make it fast" page.

One operation, float32, timed on three implementations:

- ``"lesson"``: the readable kernels of ``core/kernels/cpu.py`` (serial loops, one step each);
- ``"tuned"``: the register-tiled SIMD kernels of ``core/kernels/tuned/cpu.py`` (parallel when large);
- ``"NumPy"``: the textbook ``softmax(Q K^T / sqrt(d_k)) V`` with BLAS matrix products.

The work of attention, counted as the two matrix products (the softmax's exps and divisions are
not counted, as is usual)::

    flops = H * (2 Tq Tk d_k + 2 Tq Tk d_v)          GFLOP/s = flops / seconds / 1e9

and what the machine can do is the speed of a large float32 matrix product through NumPy's BLAS
(``sgemm``): ``2 n^3`` flops for two ``(n, n)`` matrices.

Nothing here imports Streamlit: the page draws what these functions return.
"""
from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from core.kernels import cpu as lesson_cpu
from core.kernels.tuned import borrow, fastexp, floatbits, layout, target, tiles
from core.kernels.tuned import cpu as tuned_cpu

# --- what a student may ask for ----------------------------------------------------------------
MIN_T, MAX_T = 6, 2048
MAX_LENGTHS = 8                      # sequence lengths timed in one go
MAX_HEADS = 8
D_K_CHOICES = (2, 8, 16, 32, 64, 128)
# The (H, T, T) weights of one call stay within 64 MiB of float32 (H = 4 at T = 2048): the NumPy
# version holds several arrays of that size at once, and a hosted demo has about a gigabyte.
MAX_WEIGHT_ENTRIES = 4 * 2048 * 2048
# A kernel whose call is predicted to take longer than this is skipped, with a note (the lesson
# kernel at T = 2048: a few seconds per call on two cores).
CALL_CAP_S = 1.0
PREDICT_FROM_T = 128                 # calls at or below this T take milliseconds: never skipped
# A call is skipped only when this many trial runs in a row, each the best of a few rounds and a
# short pause apart, all predict it over the cap: on a busy machine one trial run read NumPy's
# 3 ms call at T = 256 as "about 1.1 s".
PROBES = 3
REPROBE_PAUSE_S = 0.1
# When the machine is too busy to time fairly: two timings of one thing further apart than this
# factor (the ceiling before and after, a cell in the two passes), or a ceiling below this share
# of the fastest this server has measured.
UNSTEADY_RATIO = 3.0
CEILING_DROP = 0.5

KERNELS = ("lesson", "tuned", "NumPy")
OPERATIONS = ("with weights", "without weights (fused)")
DTYPE = np.float32


# --- the arithmetic ------------------------------------------------------------------------------


def attention_flops(n_heads: int, Tq: int, Tk: int, d_k: int, d_v: int | None = None) -> int:
    """Floating-point operations of attention: the two matrix products, per head.

    ``flops = H (2 Tq Tk d_k + 2 Tq Tk d_v)``: ``S = Q K^T`` is ``Tq Tk`` dot products of length
    ``d_k`` (a multiply and an add each), ``A V`` is ``Tq d_v`` dot products of length ``Tk``.

    Parameters
    ----------
    n_heads, Tq, Tk, d_k : int
        Heads, query positions, key positions, query/key width.
    d_v : int, optional
        Value width; ``d_k`` when omitted.

    Returns
    -------
    int
    """
    d_v = d_k if d_v is None else d_v
    return n_heads * (2 * Tq * Tk * d_k + 2 * Tq * Tk * d_v)


def gflops_per_second(flops: float, seconds: float) -> float:
    """``flops / seconds / 1e9``; NaN when the time is missing or not positive."""
    if not (seconds > 0):                # also catches NaN
        return math.nan
    return flops / seconds / 1e9


def sgemm_flops(n: int) -> int:
    """``2 n^3``: the product of two ``(n, n)`` matrices, ``n^2`` dot products of length ``n``."""
    return 2 * n ** 3


# --- what the student typed ----------------------------------------------------------------------


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"6, 64, 512"`` -> ``(6, 64, 512)``: sorted, without repeats.

    Raises ``ValueError`` with a message for the student when an entry is not a whole number, is
    outside ``MIN_T..MAX_T``, or when there are none or more than ``MAX_LENGTHS``.
    """
    entries = [e for e in str(text).replace(";", ",").replace(" ", ",").split(",") if e.strip()]
    if not entries:
        raise ValueError(f"Type at least one sequence length T, e.g. '6, 64, 512' (each from {MIN_T} to {MAX_T}).")
    lengths = set()
    for entry in entries:
        try:
            T = int(entry.strip())
        except ValueError:
            raise ValueError(f"'{entry.strip()[:20]}' is not a whole number: type sequence lengths such as "
                             f"'6, 64, 512'.") from None
        if not MIN_T <= T <= MAX_T:
            raise ValueError(f"T = {T} is out of range: each sequence length must be from {MIN_T} to {MAX_T}.")
        lengths.add(T)
    if len(lengths) > MAX_LENGTHS:
        raise ValueError(f"{len(lengths)} sequence lengths: this page times at most {MAX_LENGTHS} at once.")
    return tuple(sorted(lengths))


def check_sizes(lengths: Sequence[int], n_heads: int, d_k: int) -> None:
    """Refuse sizes the page does not time, with a ``ValueError`` that says which and why."""
    if not 1 <= n_heads <= MAX_HEADS:
        raise ValueError(f"Heads H = {n_heads}: choose from 1 to {MAX_HEADS}.")
    if d_k not in D_K_CHOICES:
        raise ValueError(f"d_k = {d_k}: choose one of {', '.join(map(str, D_K_CHOICES))}.")
    for T in lengths:
        if not MIN_T <= T <= MAX_T:
            raise ValueError(f"T = {T} is out of range: each sequence length must be from {MIN_T} to {MAX_T}.")
    T = max(lengths)
    if n_heads * T * T > MAX_WEIGHT_ENTRIES:
        mib = n_heads * T * T * 4 / 2 ** 20
        raise ValueError(f"H = {n_heads} heads at T = {T} make a {mib:.0f} MiB weight tensor per call; this page "
                         f"allows {MAX_WEIGHT_ENTRIES * 4 / 2 ** 20:.0f} MiB. Choose fewer heads or shorter sequences.")


# --- timing --------------------------------------------------------------------------------------


def best_seconds(fn: Callable[[], object], *, repeats: int = 5, budget_s: float = 0.15,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of ``fn``: the fastest of up to ``repeats`` rounds, within about ``budget_s``.

    One call first, timed: when it alone takes more than ``budget_s``, that is the answer (a slow
    kernel is not run again). Otherwise each round runs ``fn`` enough times to last about
    ``budget_s / repeats`` (so a microsecond call is not lost in the clock's resolution), as many
    rounds as fit the budget, and the fastest per call is returned (the first call included): the
    slower ones were slowed by something else.
    """
    start = clock()
    fn()
    first = clock() - start
    if first > budget_s:
        return first
    number = max(1, int(budget_s / repeats / max(first, 1e-9)))
    rounds = max(1, min(repeats, int(budget_s / max(number * first, 1e-9))))
    best = first
    for _ in range(rounds):
        start = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - start) / number)
    return best


# One measurement at a time in this process: two sessions timing at once share the cores (and the
# GIL, which each parallel call must win back), and each reads the other's work as its own. Measured:
# alone, the tuned T = 256 call took 387 us; two measurements at once read 803 and 1117 us.
_one_measurement = threading.Lock()


@contextmanager
def measuring_alone(waiting: Callable[[], None] = lambda: None, poll_s: float = 0.5) -> Iterator[None]:
    """Hold the process's one measurement slot for the ``with`` block; while another session holds
    it, call ``waiting()`` every ``poll_s`` seconds (a page shows a message there, and a rerun the
    student asked for can stop it there)."""
    while not _one_measurement.acquire(timeout=poll_s):
        waiting()
    try:
        yield
    finally:
        _one_measurement.release()


def numpy_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: float) -> np.ndarray:
    """The textbook version: ``softmax(Q K^T * scale) V`` with two BLAS matrix products."""
    S = (Q @ np.swapaxes(K, -1, -2)) * Q.dtype.type(scale)      # (..., Tq, Tk)
    E = np.exp(S - S.max(axis=-1, keepdims=True))               # subtract the row max: no overflow
    return (E / E.sum(axis=-1, keepdims=True)) @ V              # (..., Tq, d_v)


def attention_inputs(n_heads: int, T: int, d_k: int, seed: int = 0):
    """Seeded float32 ``Q, K, V`` of shape ``(1, H, T, d_k)`` (batch 1), standard normal."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, n_heads, T, d_k)).astype(DTYPE) for _ in range(3))


_NO_MASK = np.zeros((1, 1, 1, 1), DTYPE)   # the kernels' "no mask": one 0 broadcast everywhere


def kernel_call(kernel: str, operation: str, Q, K, V) -> Callable[[], object]:
    """A no-argument function that computes ``operation`` on ``Q, K, V`` with ``kernel``.

    The kernels' host drivers are called directly (the inputs are already what they take), so the
    times are the kernels' own, without the public API's checks.
    """
    scale = 1.0 / math.sqrt(Q.shape[-1])
    if operation not in OPERATIONS:
        raise ValueError(f"Unknown operation {operation!r}; choose one of {', '.join(OPERATIONS)}.")
    fused = operation == OPERATIONS[1]
    if kernel == "NumPy":      # builds the weights either way: NumPy has no fused form
        return lambda: numpy_attention(Q, K, V, scale)
    if kernel not in ("lesson", "tuned"):
        raise ValueError(f"Unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}.")
    module = lesson_cpu if kernel == "lesson" else tuned_cpu
    driver = module.fused_attention if fused else module.attention_with_weights
    return lambda: driver(Q, K, V, _NO_MASK, scale)


def warm_up(operations: Sequence[str] = OPERATIONS) -> None:
    """Compile (or load from the disk cache) the drivers that time ``operations`` in float32: the
    lesson kernels, and the tuned kernels' serial and parallel builds (a small and a large input);
    then run NumPy's matrix product a few times, so that its threads are started too.

    Done before timing, so that no time measured includes a compile or a cold start.
    """
    for T in (6, 128):                  # 4 x 128 x 128 x 136 multiply-adds: the parallel build
        Q, K, V = attention_inputs(4, T, 64)
        for kernel in ("lesson", "tuned"):
            for operation in operations:
                kernel_call(kernel, operation, Q, K, V)()
    sgemm_gflops(n=256)


def sgemm_gflops(n: int = 1024, repeats: int = 3) -> float:
    """What this machine can do: GFLOP/s of one ``(n, n) @ (n, n)`` float32 product through
    NumPy's BLAS, the best of ``repeats``."""
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal((n, n)).astype(DTYPE) for _ in range(2))
    return gflops_per_second(sgemm_flops(n), best_seconds(lambda: A @ B, repeats=repeats, budget_s=0.3))


# The fastest sgemm this process has measured, GFLOP/s: what the machine can do when it is quiet (a
# reading can be slowed by other work, never sped up). A later ceiling far below it was taken busy.
_fastest_ceiling = {"gflops": 0.0}


def checked_ceiling(ceiling: float, fastest: float, remeasure: Callable[[], float], tries: int = 2) -> tuple[float, bool]:
    """``(ceiling, under_load)``: sgemm is the most a kernel can do here, so a kernel measured faster
    than the ceiling means the ceiling was measured at a busy moment. Measure it again (up to
    ``tries`` times, keeping the fastest); ``under_load`` is True when it still reads below
    ``fastest`` (GFLOP/s both)."""
    for _ in range(tries):
        if not fastest > ceiling:
            break
        ceiling = max(ceiling, remeasure())
    return ceiling, bool(fastest > ceiling)


def percent_of_ceiling(gflops: float, ceiling: float) -> float:
    """``100 * gflops / ceiling``; NaN when either is missing, or when the share is over 100: no kernel
    beats the machine's own matrix product, so such a share is a ceiling measured under load, not a
    result (see :func:`checked_ceiling`)."""
    if not (gflops >= 0 and ceiling > 0):         # also catches NaN
        return math.nan
    share = 100.0 * gflops / ceiling
    return share if share <= 100.0 else math.nan


def blas_info() -> dict | None:
    """NumPy's BLAS as ``threadpoolctl`` reports it (``internal_api``, ``architecture``,
    ``num_threads``, ...); None when threadpoolctl is not installed or finds no BLAS."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    found = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    return found[0] if found else None


# --- one run of the page -------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """One cell of the comparison: ``kernel`` computing ``operation`` at sequence length ``T``."""

    T: int
    kernel: str
    operation: str
    flops: int
    seconds: float            # NaN when skipped
    note: str = ""            # why it was skipped, in words
    passes: tuple[float, ...] = ()   # the time of each pass that ran it; ``seconds`` is the fastest

    @property
    def gflops(self) -> float:
        return gflops_per_second(self.flops, self.seconds)

    @property
    def skipped(self) -> bool:
        return not self.seconds > 0

    @property
    def spread(self) -> float:
        """Slowest pass over fastest: 1 when they agree (or one pass ran it)."""
        return max(self.passes) / min(self.passes) if len(self.passes) > 1 and min(self.passes) > 0 else 1.0


def measure(lengths: Sequence[int], n_heads: int, d_k: int, operation: str, *,
            budget_s: float = 0.15, call_cap_s: float = CALL_CAP_S, passes: int = 2, probes: int = PROBES,
            pause_s: float = REPROBE_PAUSE_S, progress: Callable[[float, str], None] | None = None) -> list[Timing]:
    """Time every kernel at every sequence length (self-attention, ``Tq = Tk = T``, ``d_v = d_k``).

    Returns one :class:`Timing` per (T, kernel), T ascending, kernels in ``KERNELS`` order. Every
    cell is timed in each of ``passes`` passes over all of them (``budget_s / passes`` each) and
    keeps its fastest: a moment when something else had the cores (a browser loading the page, say)
    then spoils one pass, not the figure.

    A kernel whose call is predicted to exceed ``call_cap_s`` is not run: its row has NaN seconds
    and a note that says why. Above ``T = PREDICT_FROM_T`` the prediction is the flop count divided
    by the kernel's best speed so far at ``T >= PREDICT_FROM_T``: the work grows as T^2, and below
    ``PREDICT_FROM_T`` no call is long. While that predicts a call over the cap, the kernel is tried
    again at ``PREDICT_FROM_T`` (up to ``probes`` trial runs per pass, ``pause_s`` apart, keeping the
    fastest): a call is skipped only when every trial run agrees, and in every pass, never on one
    slow moment. ``progress(fraction, text)`` is called before each cell.
    """
    if probes < 1:
        raise ValueError("probes: at least one trial run before a call is skipped.")
    lengths = sorted(lengths)
    check_sizes(lengths, n_heads, d_k)
    if operation not in OPERATIONS:
        raise ValueError(f"Unknown operation {operation!r}; choose one of {', '.join(OPERATIONS)}.")
    speed = {}                           # kernel -> its best flops per second at T >= PREDICT_FROM_T
    times, notes = {}, {}                # (T, kernel) -> each pass's time; -> why the last pass skipped it
    cells = [(T, kernel) for T in lengths for kernel in KERNELS]
    steps = 0
    for done_passes in range(passes):
        probed = {}                      # kernel -> trial runs in this pass
        for T in lengths:
            Q, K, V = attention_inputs(n_heads, T, d_k)
            flops = attention_flops(n_heads, T, T, d_k)
            for kernel in KERNELS:
                if progress:
                    progress(steps / (passes * len(cells)), f"{kernel}, T = {T} (pass {done_passes + 1} of {passes})")
                steps += 1
                if (T, kernel) not in times and T > PREDICT_FROM_T:
                    # 1. predict the call's time, trying the kernel again while that reads over the cap
                    while ((kernel not in speed or flops / speed[kernel] > call_cap_s)
                           and probed.get(kernel, 0) < probes):
                        if probed.get(kernel, 0):
                            time.sleep(pause_s)      # let a burst of other work pass
                        probed[kernel] = probed.get(kernel, 0) + 1
                        speed[kernel] = max(speed.get(kernel, 0.0),
                                            _probe_speed(kernel, operation, n_heads, d_k, PREDICT_FROM_T))
                    predicted = flops / speed[kernel]
                    if predicted > call_cap_s:
                        notes[T, kernel] = (f"skipped: predicted about {predicted:.1f} s per call, over the "
                                            f"{call_cap_s:g} s limit (the fastest of {probed[kernel]} trial runs "
                                            f"at T = {PREDICT_FROM_T})")
                        continue
                # 2. time it
                took = best_seconds(kernel_call(kernel, operation, Q, K, V), budget_s=budget_s / passes)
                times.setdefault((T, kernel), []).append(took)
                notes.pop((T, kernel), None)
                if T >= PREDICT_FROM_T:    # the fastest seen: a busy moment should not skip a kernel
                    speed[kernel] = max(speed.get(kernel, 0.0), flops / took)
    if progress:
        progress(1.0, "done")
    return [Timing(T, kernel, operation, attention_flops(n_heads, T, T, d_k),
                   min(times.get((T, kernel), [math.nan])), notes.get((T, kernel), ""),
                   tuple(times.get((T, kernel), ()))) for T, kernel in cells]


def _probe_speed(kernel: str, operation: str, n_heads: int, d_k: int, T: int) -> float:
    """Flops per second at ``T`` (enough work that fixed costs do not dominate), best of three
    short rounds: a single call can land on a moment the machine was busy elsewhere."""
    Q, K, V = attention_inputs(n_heads, T, d_k)
    seconds = best_seconds(kernel_call(kernel, operation, Q, K, V), repeats=3, budget_s=0.03)
    return attention_flops(n_heads, T, T, d_k) / seconds


@dataclass(frozen=True)
class Measurement:
    """One run of the page: every cell's timing, the machine's ceiling, and whether to trust them."""

    rows: list[Timing]
    ceiling: float                      # GFLOP/s of sgemm, the fastest reading
    readings: tuple[float, ...]         # every sgemm reading, in order (GFLOP/s)
    busy: tuple[str, ...] = ()          # why the machine was too busy to time fairly, in words; () when it was not

    def share(self, row: Timing) -> float:
        """``row``'s GFLOP/s as a percentage of the ceiling; NaN when it is no result: the row was not
        run, the share would be over 100, or the machine was busy (then the ceiling is not what the
        machine can do)."""
        return math.nan if self.busy else percent_of_ceiling(row.gflops, self.ceiling)

    @property
    def fastest(self) -> Timing | None:
        """The measured row with the most GFLOP/s; None when nothing was measured."""
        return max((r for r in self.rows if not r.skipped), key=lambda r: r.gflops, default=None)


def busy_reasons(rows: Sequence[Timing], readings: Sequence[float], ceiling: float,
                 fastest_before: float = 0.0) -> tuple[str, ...]:
    """Why these timings are not a fair picture of this machine, one sentence each; () when they are.

    - a kernel read faster than the sgemm ceiling (after :func:`checked_ceiling` measured it again):
      the ceiling was taken while other programs had the cores;
    - two sgemm readings, or the two passes over one cell, differ more than ``UNSTEADY_RATIO``-fold
      (cells: in at least two, and at least a quarter, of those measured; one slow moment in one pass
      is what the passes are for);
    - the ceiling reads under ``CEILING_DROP`` of ``fastest_before``, the fastest this server measured.
    """
    reasons = []
    measured = [r for r in rows if not r.skipped]
    fastest = max((r.gflops for r in measured), default=0.0)
    if fastest > ceiling:
        reasons.append(f"A kernel ran at {fastest:.1f} GFLOP/s, faster than the matrix product that measures this "
                       f"machine's ceiling ({ceiling:.1f} GFLOP/s), even measured again: the ceiling was measured "
                       f"while other programs had the cores.")
    good = [g for g in readings if g > 0]
    if len(good) > 1 and max(good) > UNSTEADY_RATIO * min(good):
        reasons.append(f"The matrix-product speed read {min(good):.1f} GFLOP/s at one moment and {max(good):.1f} "
                       f"at another, a few seconds apart.")
    if fastest_before > 0 and ceiling < CEILING_DROP * fastest_before:
        reasons.append(f"The ceiling read {ceiling:.1f} GFLOP/s; earlier this server measured {fastest_before:.1f}.")
    unsteady = [r for r in measured if r.spread > UNSTEADY_RATIO]
    if len(unsteady) >= max(2, len(measured) / 4):
        reasons.append(f"{len(unsteady)} of {len(measured)} timings differed more than {UNSTEADY_RATIO:g}-fold "
                       f"between the two passes over the table.")
    return tuple(reasons)


def measure_against_ceiling(lengths: Sequence[int], n_heads: int, d_k: int, operation: str, *,
                            progress: Callable[[float, str], None] | None = None, **options) -> Measurement:
    """:func:`measure` between two readings of the sgemm ceiling, then the verdict on the machine.

    The ceiling is the faster reading, measured again while a kernel reads faster than it
    (:func:`checked_ceiling`). ``busy`` says, in words, why the run is not a fair picture of the
    machine (:func:`busy_reasons`, against the fastest ceiling this process measured before).
    ``options`` go to :func:`measure`.
    """
    readings = [sgemm_gflops()]
    rows = measure(lengths, n_heads, d_k, operation, progress=progress, **options)
    if progress:
        progress(1.0, "the matrix product again")
    readings.append(sgemm_gflops())
    fastest = max((r.gflops for r in rows if not r.skipped), default=0.0)

    def again() -> float:
        readings.append(sgemm_gflops())
        return readings[-1]

    ceiling, _ = checked_ceiling(max(readings), fastest, again)
    before = _fastest_ceiling["gflops"]
    _fastest_ceiling["gflops"] = max(before, ceiling)
    return Measurement(rows, ceiling, tuple(readings), busy_reasons(rows, readings, ceiling, before))


# --- the tuned kernel's tricks, as source --------------------------------------------------------
# Each trick of core/kernels/tuned/ and the functions that carry it out, for the page to show.
TRICKS = {
    "register tiles": [(tiles, "_product_wide_block" if target.TILE_VECTORS == 4 else "_product_block"),
                       (tiles, "_scores_tile")],
    "laid-out keys and values": [(layout, "_transpose_keys"), (layout, "_pad_values"), (layout, "_aligned_empty")],
    "online softmax": [(tiles, "_online_rescale_group"), (tiles, "_raise_max"), (tuned_cpu, "_fused_unit")],
    "fast exp": [(fastexp, "exp_vector"), (tiles, "_exp_rows_vectors")],
    "bit-trick maximum": [(floatbits, "_ordered_overload"), (floatbits, "max_of")],
    "views without reference counts": [(borrow, "borrowed")],
    "masked keys skipped": [(layout, "_live_ranges"), (tiles, "_scores_group")],
}


def source_of(obj) -> str:
    """The Python source of a function, a Numba dispatcher (its ``py_func``) or an intrinsic."""
    for attribute in ("py_func", "_defn"):
        obj = getattr(obj, attribute, obj)
    return inspect.getsource(obj)


def trick_sources(trick: str) -> list[tuple[str, str]]:
    """``[(qualified name, source), ...]`` for one entry of :data:`TRICKS`."""
    return [(f"{module.__name__}.{name}", source_of(getattr(module, name))) for module, name in TRICKS[trick]]
