"""Attention speed and memory, measured side by side in one run.

Compares, at float32 and with Python dispatch included:
- ours: ``core.attention.attention`` on the CPU backend (weights returned, and fused without weights);
- NumPy as a user would write it: ``softmax(Q @ K^T / sqrt(d_k)) @ V`` with BLAS matmuls;
- PyTorch's ``scaled_dot_product_attention``, only when torch happens to be installed.

Run: ``python -m bench.attention`` (or ``python -m bench``).
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import timeit

import numba
import numpy as np

from core import attention as at
from core import masks

SIZES = [(4, 6, 2), (8, 64, 16), (8, 128, 32), (8, 512, 64)]   # (H, T, d_k); batch 1


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


_TORCH_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from bench.attention import SIZES, median_seconds
    torch.set_num_threads(int(sys.argv[1]))
    rng = np.random.default_rng(0)
    times = {{}}
    with torch.inference_mode():
        for H, T, d_k in SIZES:
            Q, K, V = (torch.from_numpy(rng.standard_normal((1, H, T, d_k)).astype(np.float32)) for _ in range(3))
            for causal in (False, True):
                sdpa = torch.nn.functional.scaled_dot_product_attention
                times[f"{{H}},{{T}},{{d_k}},{{causal}}"] = median_seconds(lambda: sdpa(Q, K, V, is_causal=causal))
    print(json.dumps(times))
""")


def torch_seconds() -> dict | None:
    """PyTorch's SDPA timings, measured in a separate process in the same run (None without torch).

    Separate because two OpenMP runtimes in one process (Numba's and PyTorch's) spin-wait against
    each other on a small machine, which would time the contention rather than either library.
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-c", _TORCH_PROBE.format(), str(numba.get_num_threads())],
                            capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"the PyTorch timing process failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


ROUNDS = 3


def _ours_and_numpy_seconds() -> dict:
    """``{(H, T, d_k, causal): (NumPy, ours with weights, ours fused)}`` in seconds."""
    rng = np.random.default_rng(0)
    times = {}
    for H, T, d_k in SIZES:
        Q, K, V = (rng.standard_normal((1, H, T, d_k)).astype(np.float32) for _ in range(3))
        for causal in (False, True):
            mask = masks.causal(T, np.float32) if causal else None
            times[H, T, d_k, causal] = (
                median_seconds(lambda: numpy_attention(Q, K, V, mask)),
                median_seconds(lambda: at.attention(Q, K, V, mask, backend="cpu")),
                median_seconds(lambda: at.attention(Q, K, V, mask, backend="cpu", return_weights=False)))
    return times


def speed_table(rounds: int = ROUNDS) -> str:
    """The table, from ``rounds`` alternating rounds of PyTorch's process and ours.

    The machine's speed drifts over seconds on a shared host; alternating the two and keeping each
    cell's fastest round compares them at their best moments rather than at different ones.
    """
    ours_rounds, torch_rounds = [], []
    for _ in range(rounds):
        torch_rounds.append(torch_seconds())
        ours_rounds.append(_ours_and_numpy_seconds())
    with_torch = torch_rounds[0] is not None
    rows = ["| H | T | d_k | causal | NumPy µs | ours µs | ours fused µs | ours vs NumPy | "
            + ("torch SDPA µs | ours vs torch |" if with_torch else ""),
            "|---|---|---|---|---|---|---|---|" + ("---|---|" if with_torch else "")]
    for key in ours_rounds[0]:
        H, T, d_k, causal = key
        t_np, t_ours, t_fused = (min(r[key][k] for r in ours_rounds) for k in range(3))
        row = (f"| {H} | {T} | {d_k} | {'yes' if causal else 'no'} | {t_np * 1e6:.1f} | {t_ours * 1e6:.1f} "
               f"| {t_fused * 1e6:.1f} | {t_np / t_ours:.2f}x |")
        if with_torch:
            t_torch = min(r[f"{H},{T},{d_k},{causal}"] for r in torch_rounds)
            row += f" {t_torch * 1e6:.1f} | {t_torch / min(t_ours, t_fused):.2f}x |"
        rows.append(row)
    return "\n".join(rows)


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


def main() -> None:
    table = speed_table()     # runs parallel regions, so the threading layer is chosen by now
    print(f"## Attention (CPU backend, float32, {numba.get_num_threads()} Numba threads, "
          f"threading layer {numba.threading_layer()})\n")
    print(table)
    print(f"\nRatios above 1 mean ours is faster. 'ours' returns the weights; 'fused' does not "
          f"(online softmax, no (T, T) tensor). 'ours vs torch' uses the faster of the two; PyTorch is "
          f"timed in a separate process, with the same thread count, alternating with ours over {ROUNDS} "
          f"rounds; each cell is its fastest round's median.\n")
    gc.collect()
    print("## Memory of attention with return_weights=False\n")
    print("| H | T | d_k | extra peak RSS during the call | the output | K and V as laid out | "
          "weights it did not build |")
    print("|---|---|---|---|---|---|---|")
    print(memory_row())


if __name__ == "__main__":
    main()
