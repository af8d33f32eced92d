"""Induction heads, measured: what each head of the induction model (:mod:`core.training.induction_runs`:
a two-layer attention-only decoder trained on sequences whose random segment repeats to the end)
does, what the model loses on each kind of next token, and what removing a head does to both.

    run = default_run(seed=0)                                       # shipped with the app, else trained
    m = measure(run.params, run.cfg, held_out(run.setup))           # scores per head, losses per kind
    prev, ind = head_verdicts(m)
    a = ablation_effect(run.params, run.cfg, held_out(run.setup), m, 0, prev.head)   # that head removed

Measures, for attention weights ``A[t, j]`` (query ``t``, key ``j``):

* induction score: the average, over query positions whose token appeared earlier, of the weight
  on the positions right after those earlier copies (:func:`core.lessons.head_kinds.induction`);
* previous-token score: the average over ``t >= 1`` of ``A[t, t - 1]``;
* the loss on each kind of next token: a **first occurrence** (not seen before in the sequence)
  and the **repeated segment** (the next token stands right after an earlier copy of the current
  one, so copying from there predicts it). The repeat's first token is neither: the token before
  it has no earlier copy, so nothing in the sequence says the repeat starts there.

The page reads the run's data and training from here too: :mod:`core.training.induction_runs`'s
names are this module's.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from core.lessons import head_kinds
from core.model import decoder, layers, transformer
from core.model.config import TransformerConfig
from core.model.generation import attention_weights
from core.recording import recorded
from core.training.induction_runs import (  # noqa: F401  (the page's names: the run it takes apart)
    InductionRun, InductionSetup, default_run, held_out, make_data, repeat_layout, train_induction)

ABLATIONS = ("zero", "mean")        # how a removed head's output is replaced (core.model.multi_head.edit_heads)


# ----------------------------------------------------------------------------------------------
# the kinds of next token
# ----------------------------------------------------------------------------------------------
def next_token_kinds(tgt_in, tgt_out) -> tuple[np.ndarray, np.ndarray]:
    """``(first, repeated)``, each ``(B, T)`` bool, by query position: ``first`` where the next token
    has not occurred in the sequence yet; ``repeated`` where it stands right after an earlier copy of
    the current token (at an induction target, :func:`core.lessons.head_kinds.induction_targets`), so
    copying from there predicts it."""
    tgt_in, tgt_out = np.asarray(tgt_in), np.asarray(tgt_out)
    seq = np.concatenate([tgt_in[:, :1], tgt_out], axis=1)                               # (B, T + 1)
    T = tgt_in.shape[1]
    earlier = np.tril(np.ones((T + 1, T + 1), dtype=bool), k=-1)                         # i < t
    seen = ((seq[:, :, None] == seq[:, None, :]) & earlier).any(axis=-1)                 # (B, T + 1)
    targets = head_kinds.induction_targets(tgt_in)                                      # (B, T, T)
    holds = tgt_in[:, None, :] == tgt_out[:, :, None]                                    # (B, T, T): x_j == y_t
    return ~seen[:, 1:], (targets & holds).any(axis=-1)


# ----------------------------------------------------------------------------------------------
# the measures
# ----------------------------------------------------------------------------------------------
def position_losses(params: dict, cfg: TransformerConfig, tgt_in, tgt_out, ablate: dict | None = None):
    """Cross-entropy of each next token, ``(B, T)`` in nats, the logits and the forward pass's cache;
    ``ablate`` edits heads' outputs (:func:`core.model.transformer.forward`)."""
    if ablate:
        logits, cache = transformer.forward(params, cfg, tgt_in, ablate=ablate)
    else:
        logits, cache = decoder.forward(params, cfg, tgt_in)
    logp = layers.log_softmax(logits.astype(np.float64))
    return -np.take_along_axis(logp, np.asarray(tgt_out)[..., None], axis=-1)[..., 0], logits, cache


def _masked_mean(values: np.ndarray, mask: np.ndarray, axis=None):
    """Mean of ``values`` where ``mask``; NaN where nothing is selected."""
    count = mask.sum(axis=axis)
    total = np.where(mask, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


@dataclasses.dataclass
class Measures:
    """What :func:`measure` finds on a set of sequences."""

    induction: np.ndarray          # (L, H) induction score per head
    previous: np.ndarray           # (L, H) previous-token score per head
    loss_first: np.ndarray         # (T,) mean loss at each query position over first-occurrence next tokens (NaN: none)
    loss_repeated: np.ndarray      # (T,) the same over the repeated segment's next tokens
    loss_first_occurrence: float   # mean loss over every first-occurrence next token
    loss_repeated_segment: float   # mean loss over every next token of the repeated segment
    acc_repeated_segment: float    # next-token accuracy there
    loss_repeat_start: float       # mean loss on the rest: the repeat's first token
    attn: np.ndarray               # (L, B, H, T, T) every attention map


@recorded
def measure(params: dict, cfg: TransformerConfig, data, ablate: dict | None = None) -> Measures:
    """Scores per head and losses per kind of next token on ``data = (tgt_in, tgt_out)``, with the
    heads in ``ablate`` edited (:func:`core.model.multi_head.edit_heads`) when given."""
    tgt_in, tgt_out = data
    first, repeated = next_token_kinds(tgt_in, tgt_out)
    losses, logits, cache = position_losses(params, cfg, tgt_in, tgt_out, ablate)
    attn = attention_weights(cache, cfg)                                 # (L, B, H, T, T)
    hits = logits.argmax(axis=-1) == tgt_out
    by_head = attn.transpose(0, 2, 1, 3, 4)                             # (L, H, B, T, T)
    return Measures(induction=head_kinds.induction(by_head, tgt_in),
                    previous=head_kinds.previous_token(by_head).mean(axis=-1),
                    loss_first=_masked_mean(losses, first, axis=0),
                    loss_repeated=_masked_mean(losses, repeated, axis=0),
                    loss_first_occurrence=float(losses[first].mean()),
                    loss_repeated_segment=float(losses[repeated].mean()),
                    acc_repeated_segment=float(hits[repeated].mean()),
                    loss_repeat_start=float(losses[~first & ~repeated].mean()), attn=attn)


def ablate(params: dict, cfg: TransformerConfig, data, layer: int, head: int, how: str = "zero") -> Measures:
    """:func:`measure` with one head removed: its output ``o_h`` replaced, at every position, by 0
    (``how="zero"``) or by its mean over the sequence's positions (``"mean"``) before ``W_O``. The
    later layers then read a residual stream without what that head wrote."""
    if how not in ABLATIONS:
        raise ValueError(f"A head is removed by 'zero' or 'mean' ablation, got {how!r}.")
    return measure(params, cfg, data, ablate={(int(layer), int(head)): how})


@dataclasses.dataclass(frozen=True, eq=False)
class Ablation:
    """One head removed, against the intact model: the last layer's best induction score and the
    repeated segment's loss and accuracy, before and after; ``after`` holds every measure after."""

    layer: int                     # 0-based
    head: int
    how: str
    induction_before: float
    induction_after: float
    loss_before: float
    loss_after: float
    acc_before: float
    acc_after: float
    after: Measures

    @property
    def induction_ratio(self) -> float:
        """What is left of the best induction score, after / before."""
        return self.induction_after / self.induction_before if self.induction_before > 0 else float("nan")


def ablation_effect(params: dict, cfg: TransformerConfig, data, m: Measures, layer: int, head: int,
                    how: str = "zero") -> Ablation:
    """Remove head ``(layer, head)`` (:func:`ablate`) and compare with the intact model's measures ``m``
    on the same ``data``: the last layer's best induction score, the repeated segment's loss and
    accuracy."""
    after = ablate(params, cfg, data, layer, head, how)
    last = cfg.n_layers - 1
    return Ablation(int(layer), int(head), how, float(m.induction[last].max()), float(after.induction[last].max()),
                    m.loss_repeated_segment, after.loss_repeated_segment,
                    m.acc_repeated_segment, after.acc_repeated_segment, after)


# what removing a head does to the best induction score, in the words of the page's opening question
ROSE, FELL_LESS_THAN_HALF, FELL_TO_HALF_OR_LESS = 0, 1, 2


@recorded
def ablation_outcome(a: Ablation) -> int:
    """:data:`ROSE` when the best induction score rose, :data:`FELL_TO_HALF_OR_LESS` when it fell to
    half of itself or less, :data:`FELL_LESS_THAN_HALF` otherwise."""
    if a.induction_after > a.induction_before:
        return ROSE
    return FELL_TO_HALF_OR_LESS if a.induction_after <= 0.5 * a.induction_before else FELL_LESS_THAN_HALF


@recorded
def layer_one_ablations(params: dict, cfg: TransformerConfig, data, m: Measures, how: str = "zero") -> list[Ablation]:
    """:func:`ablation_effect` of each layer-1 head in turn: which one the induction head needs."""
    return [ablation_effect(params, cfg, data, m, 0, h, how) for h in range(cfg.n_heads)]


# ----------------------------------------------------------------------------------------------
# the heads' names
# ----------------------------------------------------------------------------------------------
def best_heads(m: Measures) -> tuple[int, int]:
    """``(previous-token head of layer 1, induction head of layer 2)``, by their scores."""
    return int(np.argmax(m.previous[0])), int(np.argmax(m.induction[1]))


# A head earns its name only when its score says so. Previous-token: most of its weight (half or
# more) one step back, five times a uniform causal map's 0.10 on the default sequences. Induction:
# a quarter or more of its weight on the targets, nearly three times the uniform map's 0.09.
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


@recorded
def head_verdicts(m: Measures) -> tuple[HeadVerdict, HeadVerdict]:
    """The best previous-token head of layer 1 and the best induction head of layer 2, each judged
    against its threshold (:data:`PREVIOUS_TOKEN_THRESHOLD`, :data:`INDUCTION_THRESHOLD`)."""
    prev, ind = best_heads(m)
    return (HeadVerdict("previous-token", 0, prev, float(m.previous[0, prev]), PREVIOUS_TOKEN_THRESHOLD),
            HeadVerdict("induction", 1, ind, float(m.induction[1, ind]), INDUCTION_THRESHOLD))


# ----------------------------------------------------------------------------------------------
# what no model, and a uniform map, would score
# ----------------------------------------------------------------------------------------------
@recorded
def first_occurrence_floor(tgt_in, tgt_out, vocab_size: int) -> float:
    r"""The lowest mean loss any model can have on the first-occurrence next tokens of ``data``.

    Before a first occurrence at query ``t`` the sequence has shown ``k_t`` distinct tokens, and the
    next one is any of the ``V - k_t`` others alike, so a model's mean loss there is at least
    :math:`\ln(V - k_t)` (Jensen: the mean of :math:`-\ln p` over them is at least
    :math:`-\ln` of their mean probability, at most :math:`1/(V - k_t)`). This is the mean of
    :math:`\ln(V - k_t)` over those queries."""
    tgt_in = np.asarray(tgt_in)
    first, _ = next_token_kinds(tgt_in, tgt_out)
    T = tgt_in.shape[1]
    same = tgt_in[:, :, None] == tgt_in[:, None, :]                                     # (B, T, T)
    earlier = np.tril(np.ones((T, T), dtype=bool), k=-1)
    new = ~(same & earlier).any(axis=-1)                                                 # (B, T): first showing
    distinct = np.cumsum(new, axis=1)                                                    # (B, T): k_t
    return float(np.log(vocab_size - distinct[first]).mean())


@recorded
def uniform_baselines(tgt_in) -> tuple[float, float]:
    """The scores of a uniform causal map (row ``t`` puts ``1/(t+1)`` on each allowed key, ``t``
    from 0) on ``tgt_in``: previous-token ``mean_{t>=1} 1/(t+1)``; induction, the mean of
    ``1/(t+1)`` over the queries whose token occurred earlier."""
    tgt_in = np.asarray(tgt_in)
    T = tgt_in.shape[1]
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]                    # (T, T)
    stacked = np.broadcast_to(uniform, (len(tgt_in), T, T))
    return float(head_kinds.previous_token(uniform)), float(head_kinds.induction(stacked, tgt_in))


# ----------------------------------------------------------------------------------------------
# the model the page opens on
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def opening_experiment(how: str = "zero"):
    """The page's default model (:func:`default_run`: the default setup, seed 0, shipped with the
    app), its measures on the held-out sequences, its two head verdicts and the removal of its best
    layer-1 previous-token head: ``(run, data, m, (prev, ind), ablation)``, once per process."""
    run = default_run()
    data = held_out(run.setup, run.seed)
    m = measure(run.params, run.cfg, data)
    verdicts = head_verdicts(m)
    return run, data, m, verdicts, ablation_effect(run.params, run.cfg, data, m, 0, verdicts[0].head, how)
