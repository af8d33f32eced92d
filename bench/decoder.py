"""Decoder benchmark: the training step against the same model in PyTorch, and generation with and
without the KV cache.

``python -m bench decoder`` prints:

1. milliseconds per training step of the reverse task's encoder-decoder (the page's defaults:
   batch 64, source and target length 8, d_model 32, 4 heads, d_ff 64, 2 encoder and 2 decoder
   layers, float32, Adam), side by side in alternating rounds:

   - ours as ``python -m core.training --task reverse --steps 200 --json`` reports it
     (``ms_per_step``: the real loop in a process of its own, batches drawn, evaluation excluded);
   - PyTorch in a process of its own at 1 and at 2 threads (``nn.TransformerEncoderLayer`` and
     ``nn.TransformerDecoderLayer``: post-norm, ReLU, no dropout, the same parameter count),
     timing steps on one fixed batch after a warm-up;

2. generation latency per token of a decoder-only model (d_model 32, 4 heads, d_ff 64, 2 layers,
   float32, greedy) writing T tokens after a one-token prompt, with the KV cache (each step runs
   one position) and without it (each step reruns the whole prefix), T = 16, 64, 256: best of a
   few calls, in this process.

PyTorch is optional: without it only our rows of part 1 are printed.
"""
from __future__ import annotations

import os
import time

import numpy as np

from bench import alternating_rounds, last_json_line, print_step_table, torch_step_ms, with_threads
from core.model import decoder, layers, presets
from core.model.generation import generate
from core.training import decoder_runs

TASK = "reverse"
ROUNDS = 3
TORCH_THREADS = (1, 2)
OUR_STEPS = 200
READABLE_STEPS = 40
WARMUP, TORCH_STEPS = 20, 100
GEN_LENGTHS = (16, 64, 256)
GEN_REPEATS = 3


def torch_stepper(threads: int):
    """The reverse task's encoder-decoder in PyTorch, one training step (forward, backward, Adam) per call."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    setup = decoder_runs.build(TASK)
    source, cfg = setup.cfg.encoder, setup.cfg.decoder
    d = cfg.d_model

    def block(kind):
        return kind(d, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True, layer_norm_eps=cfg.ln_eps)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_embed = nn.Embedding(source.vocab_size, d)
            self.tgt_embed = nn.Embedding(cfg.vocab_size, d)
            self.register_buffer("pe", torch.from_numpy(np.array(layers.sinusoid_table(cfg.n_ctx, d, "<f4"))))
            self.encoder = nn.ModuleList(block(nn.TransformerEncoderLayer) for _ in range(cfg.n_layers))
            self.decoder = nn.ModuleList(block(nn.TransformerDecoderLayer) for _ in range(cfg.n_layers))
            self.out = nn.Linear(d, cfg.vocab_size)

        def forward(self, src, tgt):
            m = self.src_embed(src) + self.pe[:src.shape[1]]
            for layer in self.encoder:
                m = layer(m)
            x = self.tgt_embed(tgt) + self.pe[:tgt.shape[1]]
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
            for layer in self.decoder:
                x = layer(x, m, tgt_mask=causal, tgt_is_causal=True)
            return self.out(x)

    model = Model()
    assert sum(p.numel() for p in model.parameters()) == decoder.param_count(setup.cfg)
    opt = torch.optim.Adam(model.parameters(), lr=setup.defaults.lr)
    batch = setup.defaults.batch_size
    tgt_in, tgt_out, src = (torch.from_numpy(a[:batch]).long() for a in setup.train_arrays())

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(src, tgt_in).reshape(-1, cfg.vocab_size), tgt_out.reshape(-1)).backward()
        opt.step()
    return step


def torch_ms(threads: int) -> float:
    return torch_step_ms("bench.decoder", threads, WARMUP, TORCH_STEPS)


def our_ms(track: str = "compiled", steps: int = OUR_STEPS) -> float:
    return last_json_line(["-m", "core.training", "--task", TASK, "--steps", str(steps), "--step", track,
                           "--json"])["ms_per_step"]


def measure_steps(rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Each contender's milliseconds per step in every round; the order alternates between rounds.
    The readable step (the code the page shows) runs beside the compiled one, fewer steps."""
    contenders = with_threads(our_ms, torch_ms, "PyTorch", TORCH_THREADS)
    contenders["ours, readable step"] = lambda: our_ms("readable", READABLE_STEPS)
    return alternating_rounds(contenders, rounds)


def generation_ms_per_token(T: int, use_cache: bool) -> tuple[float, int]:
    """Best wall milliseconds per new token writing ``T - 1`` tokens after a one-token prompt
    (filling a context of T), and the positions the decoder ran in all."""
    vocab = decoder_runs.build(decoder_runs.LM_TASK).cfg.vocab_size
    cfg = presets.decoder_lm(vocab, T)
    params = decoder.init_params(cfg, seed=0)
    n = T
    best, gen = np.inf, None
    for _ in range(GEN_REPEATS + 1):                   # the first call compiles and warms the caches
        t0 = time.perf_counter()
        gen = generate(params, cfg, prompt=[0], max_new_tokens=n, temperature=0.0, use_cache=use_cache)
        best = min(best, time.perf_counter() - t0)
    return 1000 * best / n, int(gen.positions_computed.sum())


def main() -> None:
    load_before = os.getloadavg()[0]
    times = measure_steps()
    load_after = os.getloadavg()[0]
    ours = min(times["ours"])
    model = decoder_runs.build(TASK).cfg
    cfg = model.decoder
    print(f"### Decoder training step: the {TASK} task, batch 64, T 8, d_model {cfg.d_model}, {cfg.n_heads} heads, "
          f"d_ff {cfg.d_ff}, {cfg.n_layers} + {cfg.n_layers} layers, {decoder.param_count(model):,} parameters, "
          "float32, Adam\n")
    print_step_table(times, "ours (`python -m core.training --task reverse`, its `ms_per_step`)")
    print(f"\n{ROUNDS} alternating rounds; {os.cpu_count()} CPUs; 1-minute load average {load_before:.1f} before "
          f"and {load_after:.1f} after.")
    torch_rows = {k: min(v) for k, v in times.items() if k.startswith("PyTorch")}
    if torch_rows:
        best = min(torch_rows, key=torch_rows.get)
        ratio = torch_rows[best] / ours
        readable = min(times["ours, readable step"])
        print(f"\nTarget: the compiled step at least 3x faster than PyTorch at its best ({best}): ours is "
              f"{ratio:.2f}x faster: {'met' if ratio >= 3 else 'not met'}. The readable step: {readable:.2f} ms, "
              f"{torch_rows[best] / readable:.2f}x PyTorch.")
    else:
        print("\nPyTorch is not installed: no comparison.")

    print("\n### Generation, per new token (decoder-only, greedy, float32, one sequence)\n")
    print("| context T | with KV cache, ms / token | positions run | without, ms / token | positions run "
          "| without / with |")
    print("|---:|---:|---:|---:|---:|---:|")
    for T in GEN_LENGTHS:
        cached, cached_positions = generation_ms_per_token(T, True)
        full, full_positions = generation_ms_per_token(T, False)
        print(f"| {T} | {cached:.3f} | {cached_positions:,} | {full:.3f} | {full_positions:,} | {full / cached:.1f}x |")
    print("\nWith the cache each step runs one position, attending over the cached keys and values (O(T) "
          "work per token); without it each step reruns the whole prefix (O(T^2) per token).")


if __name__ == "__main__":
    main()
