"""The induction model's runs: a two-layer, attention-only decoder trained on sequences in which a
random segment repeats, starting at a random place and with a random length.

Each sequence has a fixed length: a prefix of random length, then a segment ``a`` of ``n`` random
tokens (``n`` itself random), then ``a`` again and again to the end. The prefix and the segment's
first copy hold distinct tokens, so they cannot be predicted; every later token can, by the rule
"the last time I saw ``a`` it was followed by ``b``, so predict ``b``". Since neither the place of
the segment nor the distance back to its earlier copy (``n``) is fixed, no head that looks a fixed
number of positions back finds the answer. Two heads can: a previous-token head in layer 1 writes
"the token before me" into each position, and an induction head in layer 2 matches the current
token against it and copies what stands there.

(Why repeat to the end rather than once among fresh tokens: with one repeat, about a fifth of the
next tokens can be copied, and in our runs no induction head had formed after 20,000 steps; with
the repeat running to the end it forms in about a thousand.)

    data = make_data(4, seed=0)
    run = train_induction(seed=0)            # or default_run(): shipped with the app, else trained here

What the heads of a trained run do, and what removing one does, is measured by the page's lesson,
:mod:`core.lessons.induction`.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from core.model import decoder, presets
from core.model.config import TransformerConfig
from core.model.tuned import decoder_loss
from core.recording import recorded
from core.training import decoder_runs, shipped, steps as tracks


@dataclasses.dataclass(frozen=True)
class InductionSetup:
    """The task and the model's sizes; the defaults train in about four seconds on two cores."""

    length: int = 32               # tokens in each sequence; the model reads length - 1 of them
    min_segment: int = 4           # n, the repeated segment's length, is drawn from min_segment..max_segment
    max_segment: int = 10
    vocab_size: int = 32
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    steps: int = 2500
    batch_size: int = 32
    lr: float = 1e-2
    warmup: int = 100
    n_held_out: int = 200

    def __post_init__(self):
        if not (2 <= self.min_segment <= self.max_segment):
            raise ValueError(f"The segment's length is drawn from min_segment..max_segment: need "
                             f"2 <= min_segment <= max_segment, got {self.min_segment}..{self.max_segment}.")
        if 2 * self.max_segment > self.length:
            raise ValueError(f"A segment of {self.max_segment} tokens and its repeat need {2 * self.max_segment} "
                             f"positions; the sequences hold {self.length}.")
        if self.vocab_size < self.length - self.min_segment:
            raise ValueError(f"Every token outside the repeat is drawn once: sequences of {self.length} with a "
                             f"segment of {self.min_segment} need {self.length - self.min_segment} token ids, "
                             f"the vocabulary has {self.vocab_size}.")
        if min(self.steps, self.batch_size, self.n_held_out, self.n_layers) < 1:
            raise ValueError("steps, batch_size, n_held_out and n_layers must be positive whole numbers.")

    @property
    def config(self) -> TransformerConfig:
        # Attention only (d_ff=0), post-norm LayerNorm kept after each attention sublayer: it holds
        # the residual stream at unit scale. Two heads per layer: with four, the previous token was
        # spread over several layer-1 heads and removing one changed little. Seeds 0-9 measured with
        # these defaults: in 8 a layer-1 head scores 0.88-0.97 as previous-token and a layer-2 head
        # 0.94-1.00 as induction, and removing that layer-1 head (zero ablation) drops the best
        # induction score to 0.09 or less and the repeated segment's accuracy to 0.09 or less, while
        # removing the other layer-1 head leaves both above 0.94. Seeds 2 and 9 copy the repeat too
        # (accuracy 0.99) with no head passing either threshold: both layer-1 heads share the
        # previous token's job, and removing either one stops the copying (accuracy 0.03-0.06).
        return presets.attention_only(self.vocab_size, self.length - 1, self.d_model, self.n_heads,
                                      n_layers=self.n_layers, positional="sinusoidal")


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def make_data(batch: int, setup: InductionSetup = InductionSetup(), *, rng=None, seed: int = 0):
    """``(tgt_in, tgt_out)``, each ``(batch, length - 1)``: sequences ``s`` as input ``s[:-1]`` and
    next tokens ``s[1:]``. Each ``s`` is a prefix, then a segment ``a`` of ``n`` tokens, then ``a``
    again and again to the sequence's end (the last copy cut short): ``n`` drawn from
    ``min_segment..max_segment``, the prefix ``0..length - 2n`` tokens long, so at least one whole
    copy follows ``a``. The prefix and ``a`` hold distinct tokens."""
    rng = np.random.default_rng(seed) if rng is None else rng
    L = setup.length
    n = rng.integers(setup.min_segment, setup.max_segment + 1, size=(batch, 1))        # (B, 1)
    start = np.floor(rng.random((batch, 1)) * (L - 2 * n + 1)).astype(np.int64)         # (B, 1) prefix length
    fresh = np.argsort(rng.random((batch, setup.vocab_size)), axis=1)                  # (B, V) distinct ids
    i = np.arange(L)[None, :]                                                            # (1, L)
    # up to the segment's end each position reads the next fresh id; after it, the id of the
    # segment's position that is a whole number of segments earlier
    source = np.where(i < start + n, i, start + (i - start) % n)                         # (B, L)
    seq = np.take_along_axis(fresh, source, axis=1)
    return seq[:, :-1].copy(), seq[:, 1:].copy()


@recorded
def held_out(setup: InductionSetup = InductionSetup(), seed: int = 0):
    """The held-out sequences: their own random stream, never drawn during training."""
    return make_data(setup.n_held_out, setup, rng=np.random.default_rng([seed, 2]))


@recorded
def repeat_layout(tgt_in, tgt_out) -> tuple[np.ndarray, np.ndarray]:
    """``(prefix, n)``, each ``(B,)``, read off the tokens of sequences made by :func:`make_data`:
    the prefix's length (the segment starts at 0-based position ``prefix``) and the segment's
    length ``n`` (the repeat starts at ``prefix + n``)."""
    seq = np.concatenate([np.asarray(tgt_in)[:, :1], np.asarray(tgt_out)], axis=1)       # (B, T + 1)
    prefix, n = np.empty(len(seq), dtype=np.int64), np.empty(len(seq), dtype=np.int64)
    for b, row in enumerate(seq):
        first_seen = {}
        for i, token in enumerate(row.tolist()):
            if token in first_seen:                                  # the repeat's first token
                prefix[b], n[b] = first_seen[token], i - first_seen[token]
                break
            first_seen[token] = i
        else:
            raise ValueError(f"Sequence {b} repeats no token: it has no repeated segment.")
    return prefix, n


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
        decoder_loss.warm_up()                      # compiling (the first time) is not training
    t0 = time.perf_counter()
    losses = decoder_runs.train_on(params, cfg, lambda step: (*make_data(setup.batch_size, setup, rng=rng), None),
                                   steps=setup.steps, lr=setup.lr, callback=callback, track=track,
                                   rate=lambda step: setup.lr * min(1.0, (step + 1) / setup.warmup))
    return InductionRun(setup, cfg, params, losses, time.perf_counter() - t0, seed, track)


def default_run(setup: InductionSetup = InductionSetup(), *, seed: int = 0,
                track: str = tracks.DEFAULT_TRACK) -> InductionRun:
    """:func:`train_induction`'s run, read from the file shipped with the app when it is the shipped
    one (:mod:`core.training.shipped`: the default setup, seed 0), trained here otherwise."""
    def read(params, run):
        return InductionRun(setup, setup.config, params, run["losses"], run["train_seconds"], int(seed),
                            run["track"], shipped=True)

    return shipped.load_or_train(shipped.INDUCTION_FILE, {**dataclasses.asdict(setup), "seed": int(seed)},
                                 read=read, train=lambda: train_induction(setup, seed=seed, track=track))
