"""Attention speed and memory, measured side by side in one run.

Compares, at float32, batch 1, with Python dispatch included:

- ours: ``core.attention.attention`` on the CPU backend, **with weights** and **without weights**
  (``return_weights=False``: the fused online-softmax kernel), each reported on its own;
- NumPy as a user would write it: ``softmax(Q @ K^T / sqrt(d_k)) @ V`` with BLAS matmuls;
- PyTorch's ``scaled_dot_product_attention``, when torch is installed (it returns no weights).

The baselines run in processes of their own, with as many threads as Numba's (run with
``NUMBA_NUM_THREADS=1`` to compare all three on one core), alternating with ours over a few rounds:

- NumPy's with ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` removed from its environment, so that
  OpenBLAS runs the kernel it picks for this CPU (either variable forces an older, slower one). That
  process reports the BLAS kernel that ran (threadpoolctl's ``architecture``) and measures the
  machine's sgemm ceiling, which the table's GFLOP/s are set against;
- PyTorch's, because two OpenMP runtimes in one process (Numba's and PyTorch's) spin-wait against
  each other on a small machine, which would time the contention rather than either library.

With our kernels compiled for AVX2 on an AVX-512 machine, both baselines are held to AVX2 as well
(see ``AVX2_BASELINES``), as they would be on an AVX2 machine, and so is the sgemm ceiling.

Run: ``python -m bench.attention`` (or ``python -m bench attention``).
"""
from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
import textwrap
import timeit

import numba
import numpy as np

from bench import last_json_line
from core import attention as at
from core import masks
from core.kernels import dispatch
from core.kernels.tuned import target
from core.lessons.speed import attention_flops

SIZES = [(4, 6, 2), (8, 64, 16), (8, 128, 32), (8, 256, 64), (8, 512, 64)]   # (H, T, d_k); batch 1; the first is the lesson's
ROUNDS = 3
SGEMM_N = 2048
# Environment variables that pin OpenBLAS to a kernel other than the one it would pick.
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# When our kernels are compiled for AVX2 on an AVX-512 machine (NUMBA_CPU_NAME=haswell
# NUMBA_CPU_FEATURES=-avx512f: what an AVX2 laptop runs), the baselines are held to AVX2 too, as on
# such a machine. ATEN_CPU_CAPABILITY alone does not do it: PyTorch's SDPA does its matrix products
# in MKL and oneDNN, which read their own variables (measured here: T = 512 took 2.36 ms with
# ATEN_CPU_CAPABILITY=avx2 alone, 3.20 ms with all three, 2.33 ms unrestricted).
AVX2_BASELINES = {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "ONEDNN_MAX_CPU_ISA": "AVX2"}


def baselines_held_to_avx2() -> bool:
    """Whether our kernels are compiled for narrower vectors (AVX2) than this machine's (AVX-512)."""
    return target.VECTOR_BYTES == 32 and target.HOST_VECTOR_BYTES == 64
# Targets: ours against PyTorch's SDPA (time ratio SDPA / ours), with weights and without.
TARGETS = {(4, 6, 2): 1.0, (8, 64, 16): 1.5, (8, 128, 32): 1.5, (8, 256, 64): 1.5, (8, 512, 64): 1.5}
# And unmasked T = 512 at least this share of the sgemm ceiling measured in the same run.
SGEMM_SHARE_TARGET = 0.5


def numpy_attention(Q, K, V, mask=None):
    """The textbook NumPy version: two BLAS matmuls and a max-subtracted softmax."""
    S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if mask is not None:
        S = S + mask
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return (E / E.sum(axis=-1, keepdims=True)) @ V


def median_seconds(fn, budget: float = 0.4, repeats: int = 9) -> float:
    """Median over ``repeats`` runs of a loop sized to take about ``budget / repeats`` seconds each."""
    fn()
    one = timeit.timeit(fn, number=1)
    number = max(1, int(budget / repeats / max(one, 1e-7)))
    runs = timeit.repeat(fn, number=number, repeat=repeats)
    return float(np.median(runs)) / number


def sgemm_gflops(n: int = SGEMM_N, repeats: int = 5) -> float:
    """GFLOP/s of the best of ``repeats`` ``(n, n) @ (n, n)`` float32 products (``2 n^3`` flops)."""
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    A @ B
    return 2 * n ** 3 / min(timeit.repeat(lambda: A @ B, number=1, repeat=repeats)) / 1e9


def blas_info() -> dict | None:
    """NumPy's BLAS as threadpoolctl reports it (None without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    found = [{k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
             for info in threadpool_info() if info.get("user_api") == "blas"]
    return found[0] if found else None


def _key(H, T, d_k, causal) -> str:
    return f"{H},{T},{d_k},{causal}"


_NUMPY_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from bench.attention import SIZES, blas_info, median_seconds, numpy_attention, sgemm_gflops
    result = {"blas": blas_info(), "sgemm_gflops": sgemm_gflops(), "times": {}}
    if sys.argv[1] == "attention":
        rng = np.random.default_rng(0)
        for H, T, d_k in SIZES:
            Q, K, V = (rng.standard_normal((1, H, T, d_k)).astype(np.float32) for _ in range(3))
            for causal in (False, True):
                mask = np.triu(np.full((T, T), -np.inf, np.float32), 1) if causal else None
                result["times"][f"{H},{T},{d_k},{causal}"] = median_seconds(lambda: numpy_attention(Q, K, V, mask))
    print(json.dumps(result))
""")

_TORCH_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from bench.attention import SIZES, median_seconds
    torch.set_num_threads(int(sys.argv[1]))
    rng = np.random.default_rng(0)
    times = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.inference_mode():
        for H, T, d_k in SIZES:
            Q, K, V = (torch.from_numpy(rng.standard_normal((1, H, T, d_k)).astype(np.float32)) for _ in range(3))
            for causal in (False, True):
                times[f"{H},{T},{d_k},{causal}"] = median_seconds(lambda: sdpa(Q, K, V, is_causal=causal))
    print(json.dumps(times))
""")


def _baseline_env(keep_blas_overrides: bool = False) -> dict:
    """This process's environment for a baseline's process: the same thread count as our kernels
    (``NUMBA_NUM_THREADS=1 python -m bench attention`` compares all three on one core), and
    without the variables that pin OpenBLAS to another kernel unless asked to keep them."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS=str(numba.get_num_threads()))
    if not keep_blas_overrides:
        for name in BLAS_OVERRIDES:
            env.pop(name, None)
    if baselines_held_to_avx2():
        env.update(AVX2_BASELINES)
    return env


def _run_probe(script: str, *args: str, keep_blas_overrides: bool = False):
    return last_json_line(["-c", script, *args], env=_baseline_env(keep_blas_overrides))


def numpy_run() -> dict:
    """NumPy's times, its BLAS and the sgemm ceiling, from a process without the BLAS overrides."""
    return _run_probe(_NUMPY_PROBE, "attention")


def torch_seconds() -> dict | None:
    """PyTorch's SDPA timings from processes of their own (None without torch): each cell at its
    best thread count, the faster of one thread and Numba's count."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    runs = [_run_probe(_TORCH_PROBE, str(n)) for n in sorted({1, numba.get_num_threads()})]
    return {k: min(run[k] for run in runs) for k in runs[0]}


def _track(call) -> str:
    """Which kernels ``call()`` ran ("lesson", "tuned"), as the dispatch records them."""
    with dispatch.recording() as ran:
        call()
    return "+".join(dict.fromkeys(c.track for c in ran))


def _ours_seconds() -> dict:
    """``{key: (ours with weights, ours without weights, the kernels each ran)}``, seconds, through
    the public API."""
    rng = np.random.default_rng(0)
    times = {}
    for H, T, d_k in SIZES:
        Q, K, V = (rng.standard_normal((1, H, T, d_k)).astype(np.float32) for _ in range(3))
        for causal in (False, True):
            mask = masks.causal(T, np.float32) if causal else None
            weights = lambda: at.attention(Q, K, V, mask, backend="cpu")                         # noqa: E731
            fused = lambda: at.attention(Q, K, V, mask, backend="cpu", return_weights=False)     # noqa: E731
            times[_key(H, T, d_k, causal)] = (median_seconds(weights), median_seconds(fused),
                                              f"{_track(weights)} / {_track(fused)}")
    return times


def measure(rounds: int = ROUNDS) -> dict:
    """Every time, from ``rounds`` alternating rounds of the baselines' processes and ours.

    The machine's speed drifts over seconds on a shared host; alternating and keeping each cell's
    fastest round compares the implementations at their best moments rather than at different ones.
    """
    torch_rounds, numpy_rounds, ours_rounds = [], [], []
    for _ in range(rounds):
        torch_rounds.append(torch_seconds())
        numpy_rounds.append(numpy_run())
        ours_rounds.append(_ours_seconds())
    times = {}
    for H, T, d_k in SIZES:
        for causal in (False, True):
            k = _key(H, T, d_k, causal)
            times[k] = {"numpy": min(r["times"][k] for r in numpy_rounds),
                        "weights": min(r[k][0] for r in ours_rounds),
                        "fused": min(r[k][1] for r in ours_rounds),
                        "ran": ours_rounds[0][k][2],
                        "torch": min(r[k] for r in torch_rounds) if torch_rounds[0] is not None else None}
    overridden = {name: os.environ[name] for name in BLAS_OVERRIDES if name in os.environ}
    inherited = _run_probe(_NUMPY_PROBE, "sgemm", keep_blas_overrides=True) if overridden else None
    return {"times": times, "blas": numpy_rounds[0]["blas"],
            "sgemm_gflops": max(r["sgemm_gflops"] for r in numpy_rounds),
            "overridden": overridden, "inherited": inherited}


def _ratio(baseline, ours) -> str:
    return f"{baseline / ours:.2f}x" if baseline is not None else "–"


def speed_tables(run: dict) -> str:
    """The time table (ratios: baseline time / ours, above 1 means ours is faster) and the GFLOP/s table."""
    with_torch = next(iter(run["times"].values()))["torch"] is not None
    lines = ["| H | T | d_k | causal | kernels that ran (weights / fused) | NumPy µs | ours µs (weights) "
             "| ours µs (fused) | torch SDPA µs | weights vs SDPA | fused vs SDPA | weights vs NumPy | fused vs NumPy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, t in run["times"].items():
        H, T, d_k, causal = key.split(",")
        torch_us = f"{t['torch'] * 1e6:.1f}" if with_torch else "–"
        lines.append(f"| {H} | {T} | {d_k} | {'yes' if causal == 'True' else 'no'} | {t['ran']} "
                     f"| {t['numpy'] * 1e6:.1f} | {t['weights'] * 1e6:.1f} | {t['fused'] * 1e6:.1f} | {torch_us} "
                     f"| {_ratio(t['torch'], t['weights'])} | {_ratio(t['torch'], t['fused'])} "
                     f"| {_ratio(t['numpy'], t['weights'])} | {_ratio(t['numpy'], t['fused'])} |")
    ceiling = run["sgemm_gflops"]
    lines += ["", f"GFLOP/s (dense count H·(2T²d_k + 2T²d_v), also for causal rows) against the sgemm "
                  f"ceiling of {ceiling:.1f} GFLOP/s measured in the NumPy process:", "",
              "| H | T | d_k | causal | NumPy | ours (weights) | ours (fused) | torch SDPA | best as % of sgemm |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, t in run["times"].items():
        H, T, d_k, causal = key.split(",")
        flops = attention_flops(int(H), int(T), int(T), int(d_k))
        rates = {name: flops / t[name] / 1e9 for name in ("numpy", "weights", "fused", "torch")
                 if t[name] is not None}
        torch_rate = f"{rates['torch']:.2f}" if with_torch else "–"
        lines.append(f"| {H} | {T} | {d_k} | {'yes' if causal == 'True' else 'no'} | {rates['numpy']:.2f} "
                     f"| {rates['weights']:.2f} | {rates['fused']:.2f} | {torch_rate} "
                     f"| {100 * max(rates['weights'], rates['fused']) / ceiling:.1f}% |")
    return "\n".join(lines)


def target_table(run: dict) -> str | None:
    """Each target against PyTorch, with weights and without, both mask settings; None without torch."""
    if next(iter(run["times"].values()))["torch"] is None:
        return None
    lines = ["| size (H, T, d_k) | target vs SDPA | with weights (no mask, causal) | met | fused (no mask, causal) | met |",
             "|---|---|---|---|---|---|"]
    for (H, T, d_k), goal in TARGETS.items():       # (not "target": the module of that name)
        cells = [run["times"][_key(H, T, d_k, c)] for c in (False, True)]
        row = f"| {H}, {T}, {d_k} | ≥ {goal:.1f}x |"
        for kind in ("weights", "fused"):
            ratios = [c["torch"] / c[kind] for c in cells]
            row += f" {ratios[0]:.2f}x, {ratios[1]:.2f}x | {'yes' if min(ratios) >= goal else 'no'} |"
        lines.append(row)
    return "\n".join(lines)


_MEMORY_PROBE = textwrap.dedent("""
    import numpy as np
    from core import attention as at

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    H, T, d = 8, {T}, 64
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((H, T, d)).astype(np.float32) for _ in range(3))
    small = Q[:, :200]
    at.attention(small, small, small, return_weights=False, backend="cpu")   # compile and warm up
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")                           # reset the peak (VmHWM)
    out, w = at.attention(Q, K, V, return_weights=False, backend="cpu")
    peak = status("VmHWM")
    print((peak - before) / 2**20, out.nbytes / 2**20, (K.nbytes + V.nbytes) / 2**20, H * T * T * 4 / 2**20)
""")


def memory_row(T: int = 8192) -> str:
    """Extra resident memory of one fused call at H=8, T, d_k=64 float32, in a fresh process.

    Measured as the peak RSS during the call (``VmHWM`` after resetting it through
    ``/proc/self/clear_refs``) minus the RSS just before; the output array itself is included.
    """
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-c", _MEMORY_PROBE.format(T=T)], capture_output=True,
                            text=True, env=env, timeout=600)
    if result.returncode != 0:
        return f"memory probe failed: {result.stderr.strip().splitlines()[-1:]}"
    extra, out_mb, layout_mb, weights_mb = (float(x) for x in result.stdout.split())
    return f"| 8 | {T} | 64 | {extra:.1f} MiB | {out_mb:.1f} MiB | {layout_mb:.1f} MiB | {weights_mb:.0f} MiB |"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return "model unknown"


def _share_line(run: dict) -> str:
    """Unmasked T = 512 against the sgemm ceiling measured in this run."""
    H, T, d_k = SIZES[-1]
    t = run["times"][_key(H, T, d_k, False)]
    share = attention_flops(H, T, T, d_k) / min(t["weights"], t["fused"]) / 1e9 / run["sgemm_gflops"]
    met = "met" if share >= SGEMM_SHARE_TARGET else "not met"
    return (f"Unmasked T = {T}: the faster of weights and fused at {100 * share:.1f} % of this run's sgemm ceiling "
            f"(target {100 * SGEMM_SHARE_TARGET:.0f} %: {met}).")


def _blas_line(run: dict) -> str:
    blas = run["blas"]
    ran = (f"{blas['internal_api']} {blas['version']}, kernel **{blas['architecture']}**, {blas['num_threads']} threads"
           if blas else "unknown (threadpoolctl is not installed)")
    where = (f"held to AVX2 like our kernels ({', '.join(f'{k}={v}' for k, v in AVX2_BASELINES.items())}, "
             f"also for PyTorch)" if baselines_held_to_avx2() else f"in a process without {' or '.join(BLAS_OVERRIDES)}")
    line = (f"NumPy baselines: BLAS {ran}, {where}; sgemm ceiling "
            f"({SGEMM_N} × {SGEMM_N} float32) **{run['sgemm_gflops']:.1f} GFLOP/s**.")
    if run["overridden"]:
        inherited = run["inherited"]
        arch = inherited["blas"]["architecture"] if inherited["blas"] else "unknown"
        settings = ", ".join(f"{k}={v}" for k, v in run["overridden"].items())
        line += (f" This shell sets {settings}; with them OpenBLAS runs kernel {arch} and sgemm gives "
                 f"{inherited['sgemm_gflops']:.1f} GFLOP/s.")
    else:
        line += f" ({' and '.join(BLAS_OVERRIDES)} were not set in this shell{'' if baselines_held_to_avx2() else ' either'}.)"
    return line


def main() -> None:
    run = measure()     # runs parallel regions, so the threading layer is chosen by now
    print(f"## Attention (CPU backend, float32, batch 1, {numba.get_num_threads()} Numba threads, "
          f"threading layer {numba.threading_layer()})\n")
    print(_blas_line(run) + "\n")
    print(f"CPU: {platform.processor() or platform.machine()} ({_cpu_model()}); tuned kernels compiled for "
          f"{target.describe()} (NUMBA_CPU_NAME={numba.config.CPU_NAME}, "
          f"NUMBA_CPU_FEATURES={numba.config.CPU_FEATURES!r}).\n")
    print(speed_tables(run))
    print(f"\n'weights' is `attention(...)` returning the weights; 'fused' is `return_weights=False` (online "
          f"softmax, no (T, T) tensor). Ratios are the baseline's time over ours: above 1, ours is faster. "
          f"PyTorch's SDPA returns no weights. NumPy and PyTorch run in processes of their own (PyTorch at "
          f"the faster of 1 and {numba.get_num_threads()} threads, per cell), alternating with ours over {ROUNDS} rounds; each cell is its fastest round's "
          f"median.\n")
    targets = target_table(run)
    if targets:
        print(targets + "\n")
    print(_share_line(run) + "\n")
    gc.collect()
    print("## Memory of attention with return_weights=False\n")
    print("| H | T | d_k | extra peak RSS during the call | the output | K and V as laid out | "
          "weights it did not build |")
    print("|---|---|---|---|---|---|---|")
    print(memory_row())


if __name__ == "__main__":
    main()
