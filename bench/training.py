"""Training-step benchmark: our compiled encoder step against the same model in PyTorch.

``python -m bench training`` prints:

1. milliseconds per training step (forward, backward and Adam; batch 64, T 16, d_model 32,
   4 heads, d_ff 64, 2 layers, float32), each side measured its own way, side by side:

   - ours as ``python -m core.training --task sum --steps 300 --json`` reports it (``ms_per_step``):
     the real training loop in a process of its own, Python included (drawing each batch, the
     loop, the metrics), evaluation excluded, after the compiled kernels are loaded;
   - PyTorch in a process of its own (two OpenMP runtimes in one process, Numba's and PyTorch's,
     spin against each other and would time the contention), at 1 and at 2 threads, each timing
     steps on one fixed batch (no data drawing) after a warm-up;

   in alternating rounds, so that load from other work on the machine hits both sides; each
   side's best round is compared (the ratio against PyTorch's faster setting), medians beside;
2. the seconds of training the sum task needs to reach 97 % validation and test accuracy.

PyTorch is optional: without it only our rows are printed. ``BENCH_OURS_BEFORE=/path/to/an/earlier/checkout``
adds that code's two steps as more contenders, "ours (before)", in the same rounds.
"""
from __future__ import annotations

import os
import statistics

import numpy as np

from bench import BEFORE, alternating_rounds, in_tree, last_json_line, print_step_table, torch_step_ms, with_threads
from core.model import layers, presets
from core.model.tuned import classifier
from core.training import encoder_runs
from core.training.tasks import make_dataset

BATCH, SEQ_LEN = 64, 16
CFG = presets.encoder_classifier(vocab_size=10, n_ctx=SEQ_LEN, d_model=32, n_heads=4, d_ff=64, n_layers=2)
ROUNDS = 5
TORCH_THREADS = (1, 2)
OUR_STEPS = 300
READABLE_STEPS = 60
WARMUP, TORCH_STEPS = 20, 100


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (BATCH, SEQ_LEN)), rng.integers(0, 2, BATCH)


def torch_stepper(threads: int):
    """The same model in PyTorch (post-norm, ReLU, mean pooling, cross-entropy, Adam), one step per call."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    d, H, T = CFG.d_model, CFG.n_heads, SEQ_LEN

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)         # W_Q | W_K | W_V with their biases
            self.out = nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=CFG.ln_eps), nn.LayerNorm(d, eps=CFG.ln_eps)
            self.ff1, self.ff2 = nn.Linear(d, CFG.d_ff), nn.Linear(CFG.d_ff, d)

        def forward(self, h):                                          # (B, T, d)
            B = h.shape[0]
            q, k, v = self.qkv(h).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)   # (B, H, T, d_k) each
            ctx = F.scaled_dot_product_attention(q, k, v)              # (B, H, T, d_k)
            h = self.ln1(h + self.out(ctx.transpose(1, 2).reshape(B, T, d)))
            return self.ln2(h + self.ff2(F.relu(self.ff1(h))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(CFG.vocab_size, d)
            self.register_buffer("pe", torch.tensor(layers.sinusoid_table(T, d, "<f4")))
            self.layers = nn.ModuleList(Layer() for _ in range(CFG.n_layers))
            self.cls = nn.Linear(d, CFG.n_classes)

        def forward(self, tokens):
            h = self.embed(tokens) + self.pe
            for layer in self.layers:
                h = layer(h)
            return self.cls(h.mean(dim=1))

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tokens, labels = (torch.from_numpy(a).long() for a in _batch())

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(tokens), labels).backward()
        opt.step()
    return step


def torch_ms(threads: int) -> float:
    """PyTorch's wall milliseconds per step at ``threads`` threads, in a process of its own."""
    return torch_step_ms("bench.training", threads, WARMUP, TORCH_STEPS)


def our_ms(track: str = "compiled", steps: int = OUR_STEPS, tree: str | None = None) -> float:
    """``ms_per_step`` as ``python -m core.training --task sum --steps 300 --step TRACK --json`` reports it
    (run on the code of ``tree``, default this checkout)."""
    return last_json_line(["-m", "core.training", "--task", "sum", "--steps", str(steps), "--step", track,
                           "--json"], **in_tree(tree))["ms_per_step"]


def measure_steps(rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Each contender's milliseconds per step in every round; the order alternates between rounds.
    The readable step (the code the page shows) runs beside the compiled one, fewer steps."""
    contenders = with_threads(our_ms, torch_ms, "PyTorch", TORCH_THREADS)
    contenders["ours, readable step"] = lambda: our_ms("readable", READABLE_STEPS)
    if BEFORE:
        contenders["ours (before)"] = lambda: our_ms(tree=BEFORE)
        contenders["ours (before), readable step"] = lambda: our_ms("readable", READABLE_STEPS, tree=BEFORE)
    return alternating_rounds(contenders, rounds)


def time_to_accuracy(target: float = 0.97, seed: int = 0, max_steps: int = 2000, track: str = "compiled") -> dict:
    """Training seconds (``track``'s step; evaluation excluded) for the sum task to first reach
    ``target`` on the validation set, and on the held-out test set (both checked every 10 steps)."""
    data = make_dataset("sum", 4000, 1000, 1000, seed=seed)
    classifier.warm_up(encoder_runs.config_for("sum"))
    state = encoder_runs.new_state(encoder_runs.config_for("sum"), data, seed=seed, lr=7e-3, decay_steps=250)
    first = {"val": None, "test": None}
    for m in encoder_runs.train(state, data, max_steps=max_steps, eval_every=10, track=track):
        if not m["evaluated"]:
            continue
        if first["val"] is None and m["val_acc"] >= target:
            first["val"] = (m["step"], m["elapsed"], m["cpu_seconds"], m["val_acc"], encoder_runs.test_accuracy(state, data))
        if first["test"] is None and encoder_runs.test_accuracy(state, data) >= target:
            first["test"] = (m["step"], m["elapsed"], m["cpu_seconds"], m["val_acc"], encoder_runs.test_accuracy(state, data))
        if first["val"] and first["test"]:
            break
    return first


def main() -> None:
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    times = measure_steps()
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ours = min(times["ours"])
    print("### Training step: batch 64, T 16, d_model 32, 4 heads, d_ff 64, 2 layers, float32, Adam\n")
    print_step_table(times, "ours (`python -m core.training`, its `ms_per_step`)")
    print(f"\n{len(times['ours'])} alternating rounds; {os.cpu_count()} CPUs; 1-minute load average {load_before:.1f} "
          f"before and {load_after:.1f} after (above the CPU count, other processes competed for the cores).")
    torch_rows = {k: min(v) for k, v in times.items() if k.startswith("PyTorch")}
    if torch_rows:
        best = min(torch_rows, key=torch_rows.get)
        ratio = torch_rows[best] / ours
        # on the medians, against whichever setting has the lower median
        medians = min(statistics.median(times[k]) for k in torch_rows) / statistics.median(times["ours"])
        print(f"\nTarget: the compiled step at least 3x faster than PyTorch at its best. PyTorch's faster setting "
              f"here: {best}; ours is {ratio:.2f}x faster (best rounds; {medians:.2f}x on the medians, against "
              f"PyTorch's lower median): {'met' if ratio >= 3 else 'not met'}. The readable step: "
              f"{min(times['ours, readable step']):.2f} ms, {torch_rows[best] / min(times['ours, readable step']):.2f}x "
              f"PyTorch.")
    else:
        print("\nPyTorch is not installed: no comparison.")
    print("\n### Sum task to 97 % accuracy (seconds of training after JIT warm-up; lr 7e-3, batch 64)\n")
    print("| step | criterion | steps | training seconds (wall) | training seconds (CPU) | val acc | test acc |")
    print("|---|---|---:|---:|---:|---:|---:|")
    verdicts = []
    for track, limit in (("compiled", 3.0), ("readable", 15.0)):
        first = time_to_accuracy(track=track)
        for which, row in first.items():
            if row is None:
                print(f"| {track} | {which} >= 0.97 | not reached | | | | |")
            else:
                print(f"| {track} | {which} >= 0.97 | {row[0]} | {row[1]:.2f} | {row[2]:.2f} | {row[3]:.3f} | {row[4]:.3f} |")
        wall_met = all(row is not None and row[1] < limit for row in first.values())
        cpu_met = all(row is not None and row[2] < limit for row in first.values())
        verdicts.append(f"the {track} step in under {limit:.0f} s: {'met' if wall_met else 'not met'} in wall time, "
                        f"{'met' if cpu_met else 'not met'} in CPU time")
    print(f"\nTargets, 0.97 (validation and test): {'; '.join(verdicts)}.")


if __name__ == "__main__":
    main()
