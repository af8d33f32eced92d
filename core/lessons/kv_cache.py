"""What the page "Decoder and generation" measures about generation: the work each step does with
the KV cache and without it, whether the two give the same logits, and how much of a trained
reverser's cross-attention lies on the anti-diagonal.

    gen = generation.generate(params, cfg, src, max_new_tokens=8)               # with the cache
    full = generation.generate(params, cfg, src, max_new_tokens=8, use_cache=False)
    work(gen).positions.sum(), work(full).positions.sum()       # 8 and 36 for a one-token prompt
    work(gen).scores.sum(), work(full).scores.sum()             # 36 and 204: attention still grows as T²
    largest_logit_difference(gen, full)                         # ~1e-16 in float64

Step ``s`` (from 0) of a generation reads ``t = P + s`` positions (the prompt's P, then the tokens
written so far). Without the cache it runs all ``t`` through every layer, and attention scores
``t × t`` query-key pairs per head. With it, step 0 runs the P prompt positions at once (``P × P``
scores) and every later step one position, whose query scores the ``t`` cached keys.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import decoder, generation
from core.recording import recorded
from core.training.decoder_runs import build

LM_PROMPT = "attention "    # the language model's prompt when the page opens
LM_NEW_TOKENS = 24          # characters the language model writes after a prompt (context allowing)
READS_FROM_END = 0.5        # mean weight on the anti-diagonal from which a head "reads the source from its end"


@dataclasses.dataclass(frozen=True)
class Work:
    """Per step (n,): the positions run through the decoder (each through every projection, every
    FFN and every LayerNorm of every layer) and the query-key scores attention computes, per head
    and layer."""

    positions: np.ndarray
    scores: np.ndarray


@recorded
def work(gen: generation.Generation) -> Work:
    """The work of each step of ``gen``: its positions run (``gen.positions_computed``) and the
    scores its new queries compute against every key read so far, ``positions × (P + s)``."""
    positions = np.asarray(gen.positions_computed, dtype=np.int64)
    keys = gen.prompt_len + np.arange(len(positions), dtype=np.int64)          # (n,) positions read at step s
    return Work(positions, positions * keys)


@recorded
def largest_logit_difference(cached: generation.Generation, full: generation.Generation) -> float:
    """max |z_cached − z_recomputed| over every step and every token (in float64)."""
    return float(np.abs(np.asarray(cached.step_logits, np.float64) - np.asarray(full.step_logits, np.float64)).max())


def opening_generations(task: str = "reverse", example: int = 0, dtype=np.float64):
    """The two generations the page opens on, with the cache and without: the untrained model of
    ``task`` (seed 0) in ``dtype``, validation example ``example`` (the language model: the prompt
    :data:`LM_PROMPT`), the sampler's defaults (τ = 1, no top-k, no top-p), seed 0."""
    setup = build(task)
    params = {name: value.astype(dtype) for name, value in decoder.init_params(setup.cfg, seed=0).items()}
    if setup.seq2seq:
        src, prompt, n = setup.val_arrays()[2][example], None, setup.cfg.decoder.n_ctx
    else:
        src, prompt = None, setup.data.vocab.encode(LM_PROMPT)
        n = min(LM_NEW_TOKENS, setup.cfg.n_ctx - len(prompt) + 1)
    return tuple(generation.generate(params, setup.cfg, src, prompt=prompt, max_new_tokens=n, use_cache=use_cache,
                                     seed=0) for use_cache in (True, False))


@recorded
def anti_diagonal_weight(cross: np.ndarray) -> np.ndarray:
    """(L, H): how much of each head's cross-attention ``cross`` (L, H, T, S), teacher-forced, lies
    on the anti-diagonal, where output position t (from 1) reads source position S + 1 − t: the
    mean over t of that weight. A uniform row puts 1/S there; a head that reverses, nearly 1."""
    cross = np.asarray(cross, dtype=np.float64)
    T, S = cross.shape[-2:]
    if T > S:
        raise ValueError(f"The anti-diagonal needs at most as many output positions as source positions, got {T} and {S}.")
    t = np.arange(T)
    return cross[..., t, S - 1 - t].mean(axis=-1)
