"""Our packed matrix product against NumPy's BLAS and PyTorch, float32, at the real models' shapes.

``core.kernels.tuned.gemm.matmul(x, packed)`` multiplies activations ``x`` (M, K) by a weight
``W`` (K, N) packed once at load (:func:`core.kernels.tuned.gemm.pack`, not timed); NumPy's
``x @ W`` and PyTorch's ``torch.matmul(x, W)`` are handed ``W`` as it is. Shapes: the linear layers
of MiniLM, GPT-2 small and SmolLM2-135M at M = 32 to 256 rows (tokens), one generated token (M = 1)
for two of them, and 2048 x 2048 x 2048.

Each contender runs in a process of its own: two thread pools in one process (Numba's and OpenBLAS's
or PyTorch's) spin against each other on a small machine, and would time the contention (measured:
ours fell from 170 to 110 GFLOP/s after one NumPy product in the same process).

- ours at Numba's default thread count, in a process whose OpenBLAS has one thread (it computes the
  float64 reference each result is checked against before it is timed, and starts no thread pool);
- NumPy with 1 thread and with all of them (``OPENBLAS_NUM_THREADS``), the faster kept per shape,
  in the environment of :mod:`bench.attention`'s baselines: without the variables that pin OpenBLAS
  to an older kernel, and held to AVX2 when our kernels are compiled for AVX2 on an AVX-512 machine;
- PyTorch with 1 thread and with all of them (``torch.set_num_threads``), the faster kept per shape.

Each figure is the best of N calls, N sized so that a contender spends about ``BUDGET_S`` seconds on
a shape, over ``ROUNDS`` rounds alternating the contenders' order.

Run: ``python -m bench gemm``; with our kernels compiled for AVX2:
``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=-avx512f python -m bench gemm``.
"""
from __future__ import annotations

import importlib.util
import os
import textwrap
import time

import numba
import numpy as np

from bench import alternating_rounds, last_json_line
from bench.attention import AVX2_BASELINES, BLAS_OVERRIDES, _baseline_env, _cpu_model, baselines_held_to_avx2, blas_info
from core.kernels.tuned import target

# (K, N) of each model's linear layers, and the rows (tokens) each is timed at.
LAYERS = {(384, 1152): "MiniLM QKV", (384, 1536): "MiniLM FFN up", (1536, 384): "MiniLM FFN down",
          (768, 2304): "GPT-2 QKV", (768, 3072): "GPT-2 FFN up", (3072, 768): "GPT-2 FFN down",
          (576, 1536): "SmolLM2 FFN"}
ROWS = (32, 64, 128, 256)
ONE_TOKEN = {(768, 3072), (576, 1536)}          # also timed at M = 1: a token generated at a time
SQUARE = (2048, 2048, 2048)
SHAPES = [(M, K, N) for (K, N) in LAYERS for M in ((1,) if (K, N) in ONE_TOKEN else ()) + ROWS] + [SQUARE]

ROUNDS = 2
BUDGET_S = 0.1          # per contender, shape and round: 5 contenders x 2 rounds, about 1 s a row
MIN_CALLS = 3
MAX_RELATIVE_ERROR = 1e-4
# Aims, ours / baseline: on the models' shapes, and at 2048 x 2048 x 2048 (where BLAS packs once per
# call and amortises it, so packing ahead buys little).
AIM_MODELS, AIM_SQUARE = 1.2, 0.9


def flops(M: int, K: int, N: int) -> int:
    return 2 * M * K * N


def _key(M: int, K: int, N: int) -> str:
    return f"{M}x{K}x{N}"


def _operands(M: int, K: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (M, K) and ``W`` (K, N), float32, the same in every contender's process."""
    rng = np.random.default_rng(M * 1_000_003 + K * 1009 + N)
    return rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)


def best_seconds(call, budget: float = BUDGET_S) -> float:
    """The fastest of N calls, N sized to take about ``budget`` seconds (at least ``MIN_CALLS``),
    after a warm-up call (compilation, caches, the thread pool's start)."""
    call()
    start = time.perf_counter()
    call()
    one = time.perf_counter() - start
    best = one
    for _ in range(max(MIN_CALLS, int(budget / max(one, 1e-7)))):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def check_against_float64(y: np.ndarray, x: np.ndarray, W: np.ndarray) -> None:
    """Fail loudly unless ``y`` is ``x @ W`` to ``MAX_RELATIVE_ERROR`` (largest error over the largest
    entry of the float64 product)."""
    exact = x.astype(np.float64) @ W.astype(np.float64)
    error = float(np.max(np.abs(y - exact)) / np.max(np.abs(exact)))
    if not error < MAX_RELATIVE_ERROR:
        raise AssertionError(f"gemm.matmul at {x.shape[0]}x{x.shape[1]}x{W.shape[1]}: relative error "
                             f"{error:.2e} against NumPy float64 (allowed {MAX_RELATIVE_ERROR:.0e})")


def _ours_call(x: np.ndarray, W: np.ndarray):
    from core.kernels.tuned import gemm
    packed = gemm.pack(W)                           # at load, not timed
    check_against_float64(gemm.matmul(x, packed), x, W)
    return lambda: gemm.matmul(x, packed)


def _torch_call(x: np.ndarray, W: np.ndarray):
    import torch
    xt, Wt = torch.from_numpy(x), torch.from_numpy(W)
    return lambda: torch.matmul(xt, Wt)


def contender_rates(contender: str, threads: int) -> dict:
    """Run in a contender's own process: ``{"gflops": {shape: GFLOP/s}, "info": ...}`` for every shape."""
    if contender == "torch":
        import torch
        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)
    make = {"ours": _ours_call, "numpy": lambda x, W: (lambda: x @ W), "torch": _torch_call}[contender]
    rates = {}
    for M, K, N in SHAPES:
        rates[_key(M, K, N)] = flops(M, K, N) / best_seconds(make(*_operands(M, K, N))) / 1e9
    return {"gflops": rates, "info": _process_info(contender)}


def _process_info(contender: str) -> dict:
    if contender == "ours":
        return {"threads": numba.get_num_threads(), "layer": numba.threading_layer()}
    if contender == "numpy":
        return {"blas": blas_info()}
    import torch
    return {"threads": torch.get_num_threads(), "version": torch.__version__}


_PROBE = textwrap.dedent("""
    import json, sys
    from bench.gemm import contender_rates
    print(json.dumps(contender_rates(sys.argv[1], int(sys.argv[2]))))
""")


def _run(contender: str, threads: int, env: dict) -> dict:
    return last_json_line(["-c", _PROBE, contender, str(threads)], env=env)


def _contenders(all_threads: int) -> dict:
    """``{(name, threads): run}`` for every process to time: ours, NumPy and PyTorch (when installed)
    at 1 and at all threads."""
    # ours: Numba's own defaults (this shell's NUMBA_* included); a one-thread OpenBLAS for the reference
    ours_env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS="1")
    runs = {("ours", numba.config.NUMBA_NUM_THREADS): lambda: _run("ours", numba.config.NUMBA_NUM_THREADS, ours_env)}
    libraries = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") is not None else [])
    for library in libraries:
        for n in sorted({1, all_threads}):
            env = dict(_baseline_env(), OPENBLAS_NUM_THREADS=str(n))
            runs[(library, n)] = lambda library=library, n=n, env=env: _run(library, n, env)
    return runs


def measure(rounds: int = ROUNDS) -> dict:
    """Every contender's best GFLOP/s per shape over ``rounds`` alternating rounds, each library at its
    faster thread count per shape: ``{"ours"|"numpy"|"torch": {shape: (GFLOP/s, threads)}, "info": ...}``."""
    runs = alternating_rounds(_contenders(numba.config.NUMBA_NUM_THREADS), rounds)
    result: dict = {"info": {}}
    for (name, threads), results in runs.items():
        result["info"].setdefault(name, results[0]["info"])
        best = result.setdefault(name, {})
        for shape in results[0]["gflops"]:
            rate = max(r["gflops"][shape] for r in results)
            if shape not in best or rate > best[shape][0]:
                best[shape] = (rate, threads)
    return result


def _label(M: int, K: int, N: int) -> str:
    return f"{M} × {K} × {N}" + (f" ({LAYERS[(K, N)]})" if (K, N) in LAYERS else "")


def table(run: dict) -> str:
    with_torch = "torch" in run
    head = "| M × K × N | ours GFLOP/s | NumPy GFLOP/s (threads) |"
    head += " PyTorch GFLOP/s (threads) |" if with_torch else ""
    head += " ours / NumPy |" + (" ours / PyTorch |" if with_torch else "")
    lines = [head, "|---" + "|---:" * (5 if with_torch else 3) + "|"]
    for M, K, N in SHAPES:
        k = _key(M, K, N)
        ours, (numpy_rate, numpy_threads) = run["ours"][k][0], run["numpy"][k]
        row = f"| {_label(M, K, N)} | {ours:.1f} | {numpy_rate:.1f} ({numpy_threads}) |"
        if with_torch:
            torch_rate, torch_threads = run["torch"][k]
            row += f" {torch_rate:.1f} ({torch_threads}) |"
        row += f" {ours / numpy_rate:.2f} |" + (f" {ours / run['torch'][k][0]:.2f} |" if with_torch else "")
        lines.append(row)
    return "\n".join(lines)


def _aims_line(run: dict) -> str:
    """The aims, and how many shapes meet them against each baseline."""
    line = (f"Aims: ours / baseline ≥ {AIM_MODELS} on the models' shapes and ≥ {AIM_SQUARE} at "
            f"{' × '.join(map(str, SQUARE))}.")
    models = [s for s in SHAPES if s != SQUARE]
    for name, label in (("numpy", "NumPy"), ("torch", "PyTorch")):
        if name not in run:
            continue
        ratio = {s: run["ours"][_key(*s)][0] / run[name][_key(*s)][0] for s in SHAPES}
        met = sum(ratio[s] >= AIM_MODELS for s in models)
        line += (f" Against {label}: {met} of {len(models)} model shapes met, "
                 f"{SQUARE[0]}³ {'met' if ratio[SQUARE] >= AIM_SQUARE else 'not met'} ({ratio[SQUARE]:.2f}).")
    return line


def _cpu_line() -> str:
    """The CPU's model name with its family and model numbers, and the SIMD width we compiled for."""
    numbers = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                field, _, value = line.partition(":")
                if field.strip() in ("cpu family", "model") and field.strip() not in numbers:
                    numbers[field.strip()] = value.strip()
                if not line.strip():
                    break
    except OSError:
        pass
    from core.kernels.tuned import gemm
    return (f"CPU: {_cpu_model()} (family {numbers.get('cpu family', '?')}, model {numbers.get('model', '?')}); "
            f"our kernels compiled for {target.VECTOR_BYTES}-byte SIMD vectors (this CPU's: "
            f"{target.HOST_VECTOR_BYTES}), register tile {gemm.TILE_ROWS} rows × {gemm.TILE_VECTORS} vectors "
            f"(NUMBA_CPU_NAME={numba.config.CPU_NAME}, NUMBA_CPU_FEATURES={numba.config.CPU_FEATURES!r}).")


def _baselines_line(run: dict) -> str:
    blas = run["info"]["numpy"]["blas"]
    ran = (f"{blas['internal_api']} {blas['version']}, kernel **{blas['architecture']}**" if blas
           else "unknown (threadpoolctl is not installed)")
    where = (f"held to AVX2 like our kernels ({', '.join(f'{k}={v}' for k, v in AVX2_BASELINES.items())}, "
             f"also for PyTorch)" if baselines_held_to_avx2() else f"in processes without {' or '.join(BLAS_OVERRIDES)}")
    line = f"NumPy's BLAS: {ran}, {where}."
    if "torch" in run:
        line += f" PyTorch {run['info']['torch']['version']}."
    else:
        line += " PyTorch is not installed: its columns are left out."
    return line


def main() -> None:
    run = measure()
    ours = run["info"]["ours"]
    print(f"## Matrix product with a packed weight (float32; ours at {ours['threads']} Numba threads, "
          f"threading layer {ours['layer']})\n")
    print(_baselines_line(run) + "\n")
    print(table(run))
    print(f"\nGFLOP/s are 2·M·K·N over the best of N calls (packing the weight is done once, at load, and "
          f"not timed). Each contender runs in a process of its own; NumPy and PyTorch at the faster of 1 and "
          f"{numba.config.NUMBA_NUM_THREADS} threads per shape (the count in brackets); best of {ROUNDS} "
          f"alternating rounds. Ratios above 1: ours is faster. Each of our results was checked against "
          f"NumPy's float64 product (relative error < {MAX_RELATIVE_ERROR:.0e}) before it was timed.\n")
    print(_cpu_line() + "\n")
    print(_aims_line(run))


if __name__ == "__main__":
    main()
