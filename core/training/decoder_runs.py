"""The decoder's tasks and their default runs, in one place: the command line
(``python -m core.training --task reverse``) and the page "Decoder and generation" both train with
these defaults.

    run = train_task("reverse", seed=0)          # builds the data and model, trains, evaluates
    run.val_acc, run.train_seconds, run.params

Each task is a row of :data:`DEFAULTS`: a frozen :class:`TaskDefaults` (data, model sizes,
optimiser). Adding a task means adding a row and, if its data is new, a branch in :func:`build`.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from core.model import config, decoder, optim, presets

from core.model.tuned import decoder_loss
from core.model import params as P
from core.training import loop, tasks
from core.training.steps import DEFAULT_TRACK, decoder_gradient

LM_TASK = "lm"                 # the decoder-only character language model


@dataclasses.dataclass(frozen=True)
class TaskDefaults:
    """A decoder task's data, model sizes and optimiser settings."""

    task: str
    steps: int
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 50
    seq_len: int = 8               # sequence tasks: source and target length; the language model: context
    n_train: int = 4000            # sequence tasks only (the corpus fixes the language model's windows)
    n_val: int = 500
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2


DEFAULTS: dict[str, TaskDefaults] = {
    "reverse": TaskDefaults("reverse", steps=400),
    "sort": TaskDefaults("sort", steps=800),
    LM_TASK: TaskDefaults(LM_TASK, steps=400, batch_size=32, seq_len=32),
}


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run trains: the defaults it came from, the model configuration and the data."""

    defaults: TaskDefaults
    cfg: object                    # an EncoderDecoderConfig (sequence tasks) or a TransformerConfig
    data: object                   # tasks.SequenceDataset or tasks.CharCorpus

    @property
    def task(self) -> str:
        return self.defaults.task

    @property
    def seq2seq(self) -> bool:
        return self.task in tasks.SEQUENCE_TASKS

    @property
    def metric(self) -> str:
        """What ``val_acc`` measures, in words."""
        return "exact match (greedy)" if self.seq2seq else "next-character accuracy"

    def train_arrays(self):
        """``(tgt_in, tgt_out, src)`` of the training split (``src`` None for the language model)."""
        d = self.data
        return (d.tgt_in_train, d.tgt_out_train, d.src_train) if self.seq2seq else (d.X_train, d.Y_train, None)

    def val_arrays(self):
        """``(tgt_in, tgt_out, src)`` of the validation split."""
        d = self.data
        return (d.tgt_in_val, d.tgt_out_val, d.src_val) if self.seq2seq else (d.X_val, d.Y_val, None)


def build(task: str, *, seed: int = 0, **overrides) -> Setup:
    """The defaults of ``task`` (``overrides`` replace fields of :class:`TaskDefaults`), its data
    (a function of ``seed``) and its model configuration."""
    if task not in DEFAULTS:
        raise ValueError(f"Unknown decoder task {task!r}: choose one of {', '.join(DEFAULTS)}.")
    dflt = dataclasses.replace(DEFAULTS[task], **overrides)
    sizes = dict(d_model=dflt.d_model, n_heads=dflt.n_heads, d_ff=dflt.d_ff, n_layers=dflt.n_layers)
    if task in tasks.SEQUENCE_TASKS:
        ds = tasks.make_sequence_dataset(task, n_train=dflt.n_train, n_val=dflt.n_val, seq_len=dflt.seq_len, seed=seed)
        cfg = presets.seq2seq(ds.vocab_size, ds.seq_len, ds.src_vocab_size, ds.seq_len, bos_id=ds.bos_id, **sizes)
        return Setup(dflt, cfg, ds)
    corpus = tasks.make_char_corpus(context=dflt.seq_len)
    return Setup(dflt, presets.decoder_lm(corpus.vocab.size, corpus.context, **sizes), corpus)


def evaluate(setup: Setup, params: dict) -> dict:
    """Sequence tasks: ``val_acc``, the greedy exact match on the validation set. The language model:
    ``val_acc``, the share of validation characters predicted right (argmax, teacher forcing), with
    ``val_loss`` and ``unigram_loss`` (the loss of a model that reads no context) in nats per character."""
    tgt_in, tgt_out, src = setup.val_arrays()
    if setup.seq2seq:
        return {"val_acc": decoder.greedy_exact_match(params, setup.cfg, src, tgt_out)}
    hits = 0
    for lo in range(0, len(tgt_in), 500):
        logits, _ = decoder.forward(params, setup.cfg, tgt_in[lo:lo + 500])
        hits += int((logits.argmax(axis=-1) == tgt_out[lo:lo + 500]).sum())
    return {"val_acc": hits / tgt_out.size,
            "val_loss": decoder.mean_loss(params, setup.cfg, tgt_in, tgt_out),
            "unigram_loss": tasks.unigram_loss(setup.data)}


@dataclasses.dataclass
class TaskRun:
    """A trained model and what the run measured."""

    setup: Setup
    params: dict
    losses: list
    train_seconds: float
    metrics: dict                  # from :func:`evaluate`

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def val_acc(self) -> float:
        return self.metrics["val_acc"]


def fit(setup: Setup, *, steps: int | None = None, seed: int = 0, callback=None, every: int = 0,
        on_params=None, track: str = DEFAULT_TRACK) -> tuple[dict, list]:
    """Train a fresh model of ``setup`` (weights and batches from ``seed``) for ``steps`` (default:
    the task's) with the task's optimiser settings; ``(params, losses)``. ``callback(step, loss)``
    (returning True stops the run) and ``on_params(step, params)`` every ``every`` steps as in
    :func:`train`, on ``track``'s training step (readable or compiled)."""
    d = setup.defaults
    params = decoder.init_params(setup.cfg, seed=seed)
    tgt_in, tgt_out, src = setup.train_arrays()
    losses = train(params, setup.cfg, tgt_in, tgt_out, src, steps=d.steps if steps is None else steps,
                           batch_size=d.batch_size, lr=d.lr, warmup=d.warmup, seed=seed, callback=callback,
                           every=every, on_params=on_params, track=track)
    return params, losses


def train(params: dict, cfg, tgt_in, tgt_out, src=None, *, steps: int, batch_size: int = 64,
          lr: float = 3e-3, warmup: int = 50, seed: int = 0, callback=None, every: int = 0,
          on_params=None, track: str = DEFAULT_TRACK) -> list[float]:
    """Train ``params`` in place on random minibatches of a data set (``seed`` draws them); return
    each step's loss. ``cfg``: a decoder-only TransformerConfig or an EncoderDecoderConfig.

    The learning rate rises linearly over ``warmup`` steps, then decays as a half cosine to a tenth
    of ``lr`` at the last step. ``callback``, ``every``, ``on_params`` and ``track`` as in
    :func:`train_on`.
    """
    tgt_all, src_all, _ = decoder.check_pair(cfg, tgt_in, src)
    y_all = decoder.check_targets(cfg, tgt_all, tgt_out)
    if not P.whole(steps) or steps < 1 or not P.whole(batch_size) or batch_size < 1:
        raise ValueError("steps and batch_size must be positive whole numbers.")
    rng = np.random.default_rng(seed)

    def batch(step):
        idx = rng.integers(0, len(tgt_all), size=batch_size)
        return tgt_all[idx], y_all[idx], None if src_all is None else src_all[idx]

    def rate(step):                                 # linear warm-up, then a half cosine to a tenth
        progress = step / max(steps - 1, 1)
        return lr * min(1.0, (step + 1) / max(warmup, 1)) * (0.55 + 0.45 * math.cos(math.pi * progress))

    return train_on(params, cfg, batch, steps=steps, lr=lr, rate=rate, callback=callback, every=every,
                    on_params=on_params, track=track)


def train_on(params: dict, cfg, next_batch, *, steps: int, lr: float, rate, callback=None, every: int = 0,
             on_params=None, track: str = DEFAULT_TRACK) -> list[float]:
    """The training of every decoder (the tasks above, the induction model): ``steps`` Adam steps on
    ``params``, in place, each on ``next_batch(step)`` (``(tgt_in, tgt_out, src or None)``, checked
    int64 arrays) at the rate ``rate(step)``; returns each step's loss.

    ``callback(step, loss)``, if given, runs after every step; it may return True to stop early.
    ``on_params(step, params)``, if given, runs after every ``every``-th step but the last, with the
    parameters as they are then (views into the training buffer: read them, do not keep them). Each
    step's loss and gradient come from ``track``'s step (:mod:`core.training.steps`): ``"compiled"``,
    one Numba call (``core.model.tuned.decoder_loss``), or ``"readable"``, the one transformer's forward
    and hand-written backward; the tests hold the two together.
    """
    config.check_params(params, decoder.param_shapes(cfg), finite=True)
    names = list(decoder.param_shapes(cfg))
    flat, views = P.pack({name: params[name] for name in names})      # flat follows the names' order
    gradient = decoder_gradient(track, cfg, flat)
    update = loop.gradient_update(gradient, flat, np.empty_like(flat), optim.Adam(flat.size, flat.dtype, lr,
                                                                                   betas=decoder.ADAM_BETAS))
    losses = []
    for s in loop.steps(update, next_batch, stop=steps, rate=rate):
        losses.append(s.loss)
        if callback is not None and callback(s.step, s.loss):
            break
        if on_params is not None and every > 0 and (s.step + 1) % every == 0 and s.step + 1 < steps:
            on_params(s.step + 1, views)
    for name in names:
        params[name][...] = views[name]
    return losses


def train_task(task: str, *, steps: int | None = None, seed: int = 0, callback=None, track: str = DEFAULT_TRACK,
               **overrides) -> TaskRun:
    """Build ``task`` with its defaults, :func:`fit` a model and evaluate it.
    ``train_seconds`` is the wall time of training alone, the compiled step already loaded."""
    setup = build(task, seed=seed, **overrides)
    decoder_loss.warm_up()                          # compiling (the first time) is not training
    t0 = time.perf_counter()
    params, losses = fit(setup, steps=steps, seed=seed, callback=callback, track=track)
    seconds = time.perf_counter() - t0
    return TaskRun(setup, params, losses, seconds, evaluate(setup, params))


def summary(run: TaskRun) -> dict:
    """The command line's result line: task, steps, val_acc, train_seconds, ms_per_step (and the
    language model's losses)."""
    out = {"task": run.setup.task, "steps": run.steps, "val_acc": run.val_acc,
           "train_seconds": run.train_seconds, "ms_per_step": 1000.0 * run.train_seconds / max(run.steps, 1)}
    out.update({k: float(v) for k, v in run.metrics.items() if k != "val_acc"})
    return out
