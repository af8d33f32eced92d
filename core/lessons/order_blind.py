"""Why an encoder without positional encoding cannot learn the 'increasing' task, and what its
loss is before it has learned anything: the two facts the page "Train an encoder" asks about.

Without positions, attention sees the tokens as a set: reordering the input reorders every layer's
rows the same way, and the mean over positions undoes the reordering. Every negative of
'increasing' holds exactly the tokens of a positive (two neighbours swapped), so such a model gives
the two the same logits whatever its weights, and can only guess between them.

    gap = near_miss_gap("none")        # ~1e-7: a near miss gets its positive's logits
    gap = near_miss_gap("sinusoidal")  # not small: positions tell them apart
"""
from __future__ import annotations

import numpy as np

from core.model import transformer
from core.model.tuned import classifier
from core.training.encoder_runs import EncoderRun
from core.training.tasks import make_dataset


def near_misses(n_val: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(positives, negatives)`` (m, T) from the validation set of 'increasing': each negative of
    the set, and the positive that holds the same tokens in increasing order."""
    data = make_dataset("increasing", 2, n_val, 0, seed=seed)
    negatives = data.X_val[data.y_val == 0]
    return np.sort(negatives, axis=1), negatives


def near_miss_gap(positional: str, seed: int = 0) -> float:
    """max |z(positive) − z(its near miss)| over :func:`near_misses`, for the page's default encoder
    on 'increasing' with ``positional`` positions, initialised with ``seed`` (any weights will do:
    without positions the gap is rounding, whatever the weights)."""
    cfg = EncoderRun(task="increasing", positional=positional, seed=seed).config()
    params = classifier.init_params(cfg, seed=seed)
    positives, negatives = near_misses(seed=seed)
    z_pos, _ = transformer.forward(params, cfg, positives)
    z_neg, _ = transformer.forward(params, cfg, negatives)
    return float(np.abs(z_pos.astype(np.float64) - z_neg).max())


def initial_loss(task: str = "sum", seed: int = 0) -> float:
    """The mean cross-entropy (in nats) of the page's default encoder for ``task`` before its first
    step, over the task's validation set: what the loss curve starts from."""
    spec = EncoderRun(task=task, seed=seed)
    cfg = spec.config()
    params = classifier.init_params(cfg, seed=seed)
    data = make_dataset(task, spec.n_train, spec.n_val, spec.n_test, seed=seed)
    z, _ = transformer.forward(params, cfg, data.X_val)
    z = z.astype(np.float64)
    log_p = z - z.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(data.y_val)), data.y_val].mean())
