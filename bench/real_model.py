"""Real-model benchmark: a GPT-2-small-size forward pass against `transformers` on PyTorch, and the
"A real model" page's first draw and redraw.

``python -m bench real_model`` prints:

1. milliseconds per forward pass of a random-weight model of GPT-2 small's size (12 layers, 12
   heads, d 768, vocabulary 50,257; float32; one sequence) at T = 64 and T = 256, side by side in
   alternating rounds, each contender in a process of its own:

   - ours: :func:`core.models.transformer.forward` with GPT-2's settings (the full cache kept);
   - `transformers`' ``GPT2LMHeadModel`` (``torch.no_grad``, its default attention: SDPA) at 1, 2
     and all threads; the ratio uses PyTorch's best thread count (ours: OpenBLAS and Numba at their defaults);

2. the page's first full draw after the model is loaded (AppTest, the shipped model) and the median
   redraw after moving the head selector. Targets: under 5 s and under 300 ms.
"""
from __future__ import annotations

import os
import statistics
import textwrap
import time
from pathlib import Path

from bench import alternating_rounds, last_json_line, with_threads

LENGTHS = (64, 256)
ROUNDS = 3
TORCH_THREADS = tuple(sorted({1, 2, os.cpu_count() or 1}))   # its best of these is the one compared
REPEATS = 5

_OURS = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from core.models import transformer as tr
    T, repeats = int(sys.argv[1]), int(sys.argv[2])
    cfg = tr.TransformerConfig(vocab_size=50257, n_ctx=1024, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                               norm="pre", activation="gelu_tanh", positional="learned", tied_unembed=True,
                               final_ln=True)
    params = tr.init_params(cfg, seed=0, dtype=np.float32)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=T)
    tr.forward(params, cfg, ids)
    best = min((lambda t0: (tr.forward(params, cfg, ids), time.perf_counter() - t0)[1])(time.perf_counter())
               for _ in range(repeats))
    print(json.dumps({"ms": 1000 * best}))
""")

_TORCH = textwrap.dedent("""
    import json, sys, time
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    T, repeats, threads = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="sdpa").eval()
    ids = torch.randint(0, 50257, (1, T))
    with torch.no_grad():
        model(ids)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids)
            best = min(best, time.perf_counter() - t0)
    print(json.dumps({"ms": 1000 * best}))
""")


def forward_ms(T: int, rounds: int = ROUNDS) -> dict[str, float]:
    """Best milliseconds of each contender over alternating rounds."""
    contenders = with_threads(lambda: last_json_line(["-c", _OURS, str(T), str(REPEATS)])["ms"],
                              lambda n: last_json_line(["-c", _TORCH, str(T), str(REPEATS), str(n)])["ms"],
                              "transformers", TORCH_THREADS, needs=("torch", "transformers"))
    return {name: min(t) for name, t in alternating_rounds(contenders, rounds).items()}


def page_ms(repeats: int = REPEATS) -> tuple[float, float]:
    """The first full draw (model already loaded in this process) and the median redraw, in ms."""
    from streamlit.testing.v1 import AppTest

    page = str(Path(__file__).resolve().parents[1] / "views" / "real_model.py")
    AppTest.from_file(page, default_timeout=300).run()            # loads the model, compiles kernels
    at = AppTest.from_file(page, default_timeout=300)
    start = time.perf_counter()
    at.run()
    first = time.perf_counter() - start
    times = []
    for i in range(repeats):
        widget = at.number_input(key="real_model.head")
        start = time.perf_counter()
        widget.set_value(2 if i % 2 == 0 else 1).run()
        times.append(time.perf_counter() - start)
    return 1000 * first, 1000 * statistics.median(times)


def main() -> None:
    print("## A real model: GPT-2-small-size forward pass (float32, one sequence)\n")
    print("| T | contender | ms (best of rounds) | ratio to ours |")
    print("|---|---|---|---|")
    for T in LENGTHS:
        ms = forward_ms(T)
        for name, value in ms.items():
            print(f"| {T} | {name} | {value:.1f} | {value / ms['ours']:.2f} |")
        torch_best = min((v for n, v in ms.items() if n != "ours"), default=None)
        if torch_best is not None:
            print(f"| {T} | **transformers (best threads) / ours** | | **{torch_best / ms['ours']:.2f}x** |")
    first, redraw = page_ms()
    print(f"\nPage (shipped model): first full draw {first:.0f} ms (target < 5000), "
          f"redraw after a head change {redraw:.0f} ms (target < 300)")


if __name__ == "__main__":
    main()
