"""Induction heads: a two-layer, attention-only decoder trained on random sequences repeated once.

Each sequence is ``n`` random tokens (distinct, so every token's earlier copy is unique) followed
by the same ``n`` tokens again. The first half cannot be predicted; the second half can, by the
rule "the last time I saw ``a`` it was followed by ``b``, so predict ``b``". One head cannot do
that; two can: a previous-token head in layer 1 writes "the token before me" into each position,
and an induction head in layer 2 matches the current token against it and copies what followed.

    data = make_data(4, seed=0);  run = train_induction(seed=0)
    m = measure(run.params, run.cfg, held_out(run.setup))     # scores per head, losses per half

Measures, for attention weights ``A[t, j]`` (query ``t``, key ``j``):

* induction score: the average, over query positions whose token appeared earlier, of the weight
  on the position right after that earlier copy (``j = t - n + 1`` here);
* previous-token score: the average over ``t >= 1`` of ``A[t, t - 1]``;
* the loss on the first half vs the second (repeated) half, by the half the query sits in.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from core.model import decoder, decoder_step, head_scores, layers, presets
from core.model.config import TransformerConfig
from core.model.generation import attention_weights
from core.training import decoder_runs, shipped, steps as tracks


@dataclasses.dataclass(frozen=True)
class InductionSetup:
    """The task and the model's sizes; the defaults train in about a second on two cores."""

    half: int = 10                 # n: tokens in each half
    vocab_size: int = 20
    d_model: int = 32
    n_heads: int = 4
    steps: int = 1200
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 30
    n_held_out: int = 200

    def __post_init__(self):
        if not (2 <= self.half <= self.vocab_size):
            raise ValueError(f"half must be between 2 and vocab_size ({self.vocab_size}): each half draws "
                             f"distinct tokens, got {self.half}.")
        if self.steps < 1 or self.batch_size < 1 or self.n_held_out < 1:
            raise ValueError("steps, batch_size and n_held_out must be positive whole numbers.")

    @property
    def config(self) -> TransformerConfig:
        # Attention only (d_ff=0), post-norm LayerNorm kept after each attention sublayer: it holds
        # the residual stream at unit scale, so the Adam rate used for the other decoder tasks works
        # unchanged, and every seed we tried formed an induction head within the default steps.
        return presets.attention_only(self.vocab_size, 2 * self.half - 1, self.d_model, self.n_heads, n_layers=2,
                                      positional="sinusoidal")


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def make_data(batch: int, setup: InductionSetup = InductionSetup(), *, rng=None, seed: int = 0):
    """``(tgt_in, tgt_out)``, each ``(batch, 2n - 1)``: the sequence ``s = [a, a]`` (``a``: ``n``
    distinct random tokens) as input ``s[:-1]`` and next tokens ``s[1:]``."""
    rng = np.random.default_rng(seed) if rng is None else rng
    first = np.argsort(rng.random((batch, setup.vocab_size)), axis=1)[:, :setup.half]   # (B, n) distinct
    seq = np.concatenate([first, first], axis=1)                                       # (B, 2n)
    return seq[:, :-1].copy(), seq[:, 1:].copy()


def held_out(setup: InductionSetup = InductionSetup(), seed: int = 0):
    """The held-out sequences: their own random stream, never drawn during training."""
    return make_data(setup.n_held_out, setup, rng=np.random.default_rng([seed, 2]))


# ----------------------------------------------------------------------------------------------
# the measures
# ----------------------------------------------------------------------------------------------
def position_losses(params: dict, cfg: TransformerConfig, tgt_in, tgt_out):
    """Cross-entropy of each next token, ``(B, T)`` in nats, and the forward pass's cache."""
    logits, cache = decoder.forward(params, cfg, tgt_in)
    logp = layers.log_softmax(logits.astype(np.float64))
    return -np.take_along_axis(logp, np.asarray(tgt_out)[..., None], axis=-1)[..., 0], logits, cache


@dataclasses.dataclass
class Measures:
    """What :func:`measure` finds on a set of sequences (``n``: the half length)."""

    induction: np.ndarray          # (L, H) induction score per head
    previous: np.ndarray           # (L, H) previous-token score per head
    loss_by_position: np.ndarray   # (T,) mean loss of each query position
    loss_first_half: float         # query positions 0..n-1
    loss_second_half: float        # query positions n..2n-2: the repeated half
    acc_second_half: float         # next-token accuracy there
    attn: np.ndarray               # (L, B, H, T, T) every attention map


def measure(params: dict, cfg: TransformerConfig, data) -> Measures:
    """Scores per head and losses per half on ``data = (tgt_in, tgt_out)``."""
    tgt_in, tgt_out = data
    n = (cfg.n_ctx + 1) // 2
    losses, logits, cache = position_losses(params, cfg, tgt_in, tgt_out)
    attn = attention_weights(cache, cfg)                                 # (L, B, H, T, T)
    hits = logits.argmax(axis=-1) == tgt_out
    by_head = attn.transpose(0, 2, 1, 3, 4)                             # (L, H, B, T, T)
    return Measures(induction=head_scores.induction(by_head, tgt_in),
                    previous=head_scores.previous_token(by_head).mean(axis=-1),
                    loss_by_position=losses.mean(axis=0), loss_first_half=float(losses[:, :n].mean()),
                    loss_second_half=float(losses[:, n:].mean()), acc_second_half=float(hits[:, n:].mean()),
                    attn=attn)


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class InductionRun:
    setup: InductionSetup
    cfg: TransformerConfig
    params: dict
    losses: list
    train_seconds: float
    seed: int
    track: str = tracks.DEFAULT_TRACK      # the training step that ran: readable or compiled
    shipped: bool = False                  # read from the file shipped with the app (trained ahead)


def train_induction(setup: InductionSetup = InductionSetup(), *, seed: int = 0, callback=None,
                    track: str = tracks.DEFAULT_TRACK) -> InductionRun:
    """Train a fresh model with Adam on new random sequences each step (seeded: same seed, same
    model, to rounding whichever ``track``'s training step runs). The rate rises linearly over
    ``warmup`` steps, then stays. The training is every decoder's (:func:`decoder_runs.train_on`);
    ``callback(step, loss)`` runs after each step and may return True to stop it."""
    cfg = setup.config
    params = decoder.init_params(cfg, seed=seed, dtype=np.float32)
    rng = np.random.default_rng([seed, 1])
    if track == "compiled":
        decoder_step.warm_up()                      # compiling (the first time) is not training
    t0 = time.perf_counter()
    losses = decoder_runs.train_on(params, cfg, lambda step: (*make_data(setup.batch_size, setup, rng=rng), None),
                                   steps=setup.steps, lr=setup.lr, callback=callback, track=track,
                                   rate=lambda step: setup.lr * min(1.0, (step + 1) / setup.warmup))
    return InductionRun(setup, cfg, params, losses, time.perf_counter() - t0, seed, track)


def default_run(setup: InductionSetup = InductionSetup(), *, seed: int = 0,
                track: str = tracks.DEFAULT_TRACK) -> InductionRun:
    """:func:`train_induction`'s run, read from the file shipped with the app when it is the shipped
    one (:mod:`core.training.shipped`: the default setup, seed 0), trained here otherwise."""
    found = shipped.find(shipped.INDUCTION_FILE, {**dataclasses.asdict(setup), "seed": int(seed)})
    if found is None:
        return train_induction(setup, seed=seed, track=track)
    params, run = found
    return InductionRun(setup, setup.config, params, run["losses"], run["train_seconds"], int(seed),
                        run["track"], shipped=True)


def best_heads(m: Measures) -> tuple[int, int]:
    """``(previous-token head of layer 1, induction head of layer 2)``, by their scores."""
    return int(np.argmax(m.previous[0])), int(np.argmax(m.induction[1]))


# A head earns its name only when its score says so. Previous-token: most of its weight (half or
# more) one step back, over three times a uniform causal map's 0.14 at n = 10. Induction: a
# quarter or more of its weight on the targets, over three times the uniform map's 0.07.
PREVIOUS_TOKEN_THRESHOLD = 0.5
INDUCTION_THRESHOLD = 0.25


@dataclasses.dataclass(frozen=True)
class HeadVerdict:
    """The best-scoring head of a layer for one role, and whether its score earns the role's name."""

    role: str              # "previous-token" or "induction"
    layer: int             # 0-based
    head: int              # 0-based
    score: float
    threshold: float

    @property
    def formed(self) -> bool:
        return self.score >= self.threshold


def head_verdicts(m: Measures) -> tuple[HeadVerdict, HeadVerdict]:
    """The best previous-token head of layer 1 and the best induction head of layer 2, each judged
    against its threshold (:data:`PREVIOUS_TOKEN_THRESHOLD`, :data:`INDUCTION_THRESHOLD`)."""
    prev, ind = best_heads(m)
    return (HeadVerdict("previous-token", 0, prev, float(m.previous[0, prev]), PREVIOUS_TOKEN_THRESHOLD),
            HeadVerdict("induction", 1, ind, float(m.induction[1, ind]), INDUCTION_THRESHOLD))


def best_first_half_losses(setup: InductionSetup) -> np.ndarray:
    """``(n - 1,)``: the lowest possible loss at query positions ``0..n-2``. The next token there is
    drawn uniformly from the ``V - t - 1`` tokens not yet used, so the best is ``ln(V - t - 1)``."""
    return np.log(setup.vocab_size - np.arange(setup.half - 1) - 1.0)


def uniform_baselines(T: int, half: int) -> tuple[float, float]:
    """The scores of a uniform causal map (row ``t`` puts ``1/(t+1)`` on each allowed key):
    previous-token ``mean_{t>=1} 1/(t+1)``, induction ``mean_{t>=n} 1/(t+1)``."""
    return (float(np.mean([1 / (t + 1) for t in range(1, T)])),
            float(np.mean([1 / (t + 1) for t in range(half, T)])))


def summary(run: InductionRun, m: Measures) -> dict:
    """The command line's result line."""
    return {"task": "induction", "steps": run.setup.steps, "val_acc": m.acc_second_half,
            "train_seconds": run.train_seconds, "ms_per_step": 1000.0 * run.train_seconds / run.setup.steps,
            "induction_score": float(m.induction[1].max()), "previous_token_score": float(m.previous[0].max()),
            "loss_first_half": m.loss_first_half, "loss_second_half": m.loss_second_half}
