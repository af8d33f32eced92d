"""Training the tiny encoder: a resumable generator of metrics, evaluation helpers, one run's
settings, and the default model the page "Inside a trained model" opens on.

    state = new_state(cfg, data, seed=0)
    for metrics in train(state, data, max_steps=300):    # one dict per step
        ...                                               # state.params is the live model
    test_accuracy(state, data); confusion_table(state, data)
    model = default_model("sum", seed=0)                  # shipped with the app, else trained here

Everything that changes during training lives in :class:`TrainState` (parameters, Adam moments,
the random generator that draws batches, the step count), so a new ``train(state, ...)`` call
carries on exactly where the last one stopped: stopping and resuming gives the same numbers as
running straight through.

Its command line is ``python -m core.training`` (:mod:`core.training.__main__`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from core import limits
from core.model import presets, transformer
from core.model.tuned import classifier
from core.model.config import TransformerConfig
from core.model.optim import Adam
from core.model.params import pack
from core.training import loop, shipped
from core.training.steps import DEFAULT_TRACK, encoder_update
from core.training.tasks import TASKS, Dataset, make_dataset
from core.validate import check_heads


@dataclasses.dataclass
class TrainState:
    """Everything a run needs to continue: parameters (views of ``flat``), Adam, rng, counters."""

    cfg: TransformerConfig
    flat: np.ndarray
    params: dict
    grad_flat: np.ndarray
    grads: dict
    optimizer: Adam
    rng: np.random.Generator
    batch_size: int
    base_lr: float = 3e-3
    decay_steps: int | None = None
    step: int = 0
    train_seconds: float = 0.0
    cpu_seconds: float = 0.0
    val_acc: float | None = None


def new_state(cfg: TransformerConfig, data: Dataset | None = None, *, seed: int = 0, lr: float = 3e-3,
              batch_size: int = 64, decay_steps: int | None = None, dtype=np.float32) -> TrainState:
    """A fresh model and optimiser; ``seed`` fixes both the initial weights and the batch order.

    ``decay_steps``: the learning rate falls linearly from ``lr`` to ``lr / 10`` over that many steps
    (then stays there), which settles the last few per cent of accuracy; ``None`` keeps it constant.
    """
    if data is not None and (data.seq_len > cfg.n_ctx or data.vocab_size > cfg.vocab_size):
        raise ValueError(f"The data ({data.seq_len} tokens from {data.vocab_size} ids) does not fit the model "
                         f"(n_ctx {cfg.n_ctx}, vocab_size {cfg.vocab_size}).")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be a positive whole number, got {batch_size}.")
    if not lr > 0:
        raise ValueError(f"The learning rate must be positive, got {lr}.")
    flat, params = pack(classifier.init_params(cfg, seed=seed, dtype=dtype))
    grad_flat, grads = pack({k: np.zeros_like(v) for k, v in params.items()})
    return TrainState(cfg, flat, params, grad_flat, grads, Adam(flat.size, flat.dtype, lr=lr),
                      np.random.default_rng([seed, 1]), int(batch_size), float(lr), decay_steps)


def accuracy(state: TrainState, X: np.ndarray, y: np.ndarray, track: str = DEFAULT_TRACK) -> float:
    """Fraction of sequences whose arg-max class is the label, by ``track``'s forward pass: the
    compiled one, or the readable transformer (256 sequences at a time)."""
    if len(y) == 0:
        return float("nan")
    X = np.ascontiguousarray(X, dtype=np.int64)
    if track == "compiled":
        return float(np.mean(classifier.predict_flat(state.flat, X, state.cfg) == y))
    logits = np.concatenate([transformer.forward(state.params, state.cfg, X[i:i + 256])[0]
                             for i in range(0, len(X), 256)])
    return float(np.mean(logits.argmax(axis=-1) == y))


def train(state: TrainState, data: Dataset, *, max_steps: int = 300, max_seconds: float | None = None,
          eval_every: int = 25, target_val_acc: float | None = None, track: str = DEFAULT_TRACK) -> Iterator[dict]:
    """Train until ``state.step == max_steps`` (a total, so a resumed run stops at the same place),
    ``max_seconds`` of training in this call, or validation accuracy reaching ``target_val_acc``.

    Yields one dict per step: ``step``, ``loss``, ``train_acc`` (of that batch), ``val_acc`` (the
    latest evaluation, every ``eval_every`` steps and at the end), ``evaluated`` (whether this step
    evaluated), ``elapsed`` (wall seconds spent training, evaluation excluded, over the whole run),
    ``cpu_seconds`` (the same in CPU time of this thread: unaffected by other busy processes),
    ``ms_per_step`` and ``track``.

    ``track`` chooses the training step (:mod:`core.training.steps`): ``"readable"``, the transformer's
    forward and hand-written backward (the code the page shows), or ``"compiled"``, the same step
    in one Numba call.
    """
    X = np.ascontiguousarray(data.X_train, dtype=np.int64)
    y = np.ascontiguousarray(data.y_train, dtype=np.int64)
    n, bs = len(y), min(state.batch_size, len(y))
    started = state.train_seconds

    def batch(step):
        idx = state.rng.integers(0, n, size=bs)
        return X[idx], y[idx]

    def rate(step):                                 # linear decay to a tenth over decay_steps
        if not state.decay_steps:
            return state.base_lr
        return state.base_lr * max(0.1, 1.0 - 0.9 * step / state.decay_steps)

    update = encoder_update(track, state)
    for s in loop.steps(update, batch, start=state.step, stop=max_steps, rate=rate):
        loss, correct = s.loss
        state.step += 1
        state.train_seconds += s.seconds
        state.cpu_seconds += s.cpu_seconds
        out_of_time = max_seconds is not None and state.train_seconds - started >= max_seconds
        last = state.step >= max_steps or out_of_time
        evaluated = state.step % eval_every == 0 or last
        if evaluated:
            state.val_acc = accuracy(state, data.X_val, data.y_val, track)
        reached = target_val_acc is not None and state.val_acc is not None and state.val_acc >= target_val_acc
        yield {"step": state.step, "loss": loss, "train_acc": correct / bs, "val_acc": state.val_acc,
               "evaluated": evaluated, "elapsed": state.train_seconds, "cpu_seconds": state.cpu_seconds,
               "ms_per_step": 1000.0 * state.train_seconds / state.step, "track": track}
        if out_of_time or (evaluated and reached):
            return


def test_accuracy(state: TrainState, data: Dataset) -> float:
    return accuracy(state, data.X_test, data.y_test)


def confusion_table(state: TrainState, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``table[true, predicted]`` counts, (C, C)."""
    pred = classifier.predict_flat(state.flat, np.ascontiguousarray(X, dtype=np.int64), state.cfg)
    C = state.cfg.n_classes
    table = np.zeros((C, C), dtype=np.int64)
    np.add.at(table, (np.asarray(y), pred), 1)
    return table


def config_for(task: str, **overrides) -> TransformerConfig:
    """The default encoder classifier (:func:`core.model.presets.encoder_classifier`) sized for a
    task's default sequences (overrides, the preset's arguments, win)."""
    spec = TASKS[task] if task in TASKS else None
    if spec is None:
        raise ValueError(f"Unknown task {task!r}: choose one of {', '.join(TASKS)}.")
    fields = {"n_ctx": spec.seq_len, "vocab_size": spec.vocab_size}
    fields.update(overrides)
    return presets.encoder_classifier(**fields)


def run(task: str = "sum", steps: int = 300, *, seed: int = 0, lr: float = 3e-3, positional: str = "sinusoidal",
        n_train: int = 4000, n_val: int = 1000, n_test: int = 1000, max_seconds: float | None = None,
        target_val_acc: float | None = None, eval_every: int = 25, on_metrics=None,
        track: str = DEFAULT_TRACK) -> dict:
    """Make the data set, train, and summarise (the command line calls this)."""
    data = make_dataset(task, n_train, n_val, n_test, seed=seed)
    cfg = config_for(task, positional=positional)
    classifier.warm_up(cfg)          # compile (or load) the kernels before the clock starts
    state = new_state(cfg, data, seed=seed, lr=lr, decay_steps=steps)
    for metrics in train(state, data, max_steps=steps, max_seconds=max_seconds, eval_every=eval_every,
                         target_val_acc=target_val_acc, track=track):
        if on_metrics is not None:
            on_metrics(metrics)
    return {"task": task, "steps": state.step, "val_acc": state.val_acc,
            "test_acc": test_accuracy(state, data), "train_seconds": state.train_seconds,
            "cpu_seconds": state.cpu_seconds,
            "ms_per_step": 1000.0 * state.train_seconds / max(state.step, 1), "state": state, "data": data}


# ----------------------------------------------------------------------------------------------
# one run's settings, as the page and the command line give them
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EncoderRun:
    """One training run: the task, the model's sizes and the optimiser's settings."""

    task: str = "sum"
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 32
    positional: str = "sinusoidal"
    lr: float = 3e-3
    steps: int = 300
    seed: int = 0
    label: str = "run"
    n_train: int = 4000
    n_val: int = 1000
    n_test: int = 1000
    batch_size: int = 64
    eval_every: int = 25

    def check(self) -> "EncoderRun":
        """Refuse sizes beyond ``core.limits`` or a head count that does not divide d_model."""
        if not 1 <= int(self.n_layers) <= limits.MAX_TRAIN_LAYERS:
            raise ValueError(f"Layers must be between 1 and {limits.MAX_TRAIN_LAYERS}, got {self.n_layers}.")
        if not 1 <= int(self.d_model) <= limits.MAX_TRAIN_D_MODEL:
            raise ValueError(f"d_model must be between 1 and {limits.MAX_TRAIN_D_MODEL}, got {self.d_model}.")
        if not 1 <= int(self.n_heads) <= limits.MAX_TRAIN_HEADS:
            raise ValueError(f"Heads must be between 1 and {limits.MAX_TRAIN_HEADS}, got {self.n_heads}.")
        check_heads(int(self.d_model), int(self.n_heads))
        if not 1 <= int(self.steps) <= limits.MAX_TRAIN_STEPS:
            raise ValueError(f"Steps must be between 1 and {limits.MAX_TRAIN_STEPS}, got {self.steps}.")
        if not (np.isfinite(self.lr) and 0 < self.lr <= 1):
            raise ValueError(f"The learning rate must be in (0, 1], got {self.lr}.")
        return self

    def config(self) -> TransformerConfig:
        """The encoder classifier this spec trains (feed-forward width 2 d_model, as the default 32 -> 64)."""
        return config_for(self.task, d_model=int(self.d_model), n_heads=int(self.n_heads),
                                   d_ff=2 * int(self.d_model), n_layers=int(self.n_layers),
                                   positional=self.positional)


# ----------------------------------------------------------------------------------------------
# the default model: the run "Inside a trained model" opens on, shipped with the app
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainedEncoder:
    """A trained encoder, the data it was trained and tested on, and how it came about."""

    params: dict
    cfg: TransformerConfig
    data: Dataset
    origin: str


def _spec(task, seed, n_train, n_val, n_test, steps) -> EncoderRun:
    return EncoderRun(task=task, seed=int(seed), n_train=n_train, n_val=n_val, n_test=n_test,
                      **({} if steps is None else {"steps": int(steps)})).check()


def _origin(spec: EncoderRun, track: str) -> str:
    """How a default model came about, as the page names it (the track says which step trained it)."""
    return (f"default model: {spec.steps} steps on '{spec.task}', seed {spec.seed}, "
            f"trained on the {track} training step")


def train_default(task: str = "sum", seed: int = 0, *, n_train: int = 4000, n_val: int = 1000,
                  n_test: int = 1000, steps: int | None = None, track: str = DEFAULT_TRACK) -> TrainedEncoder:
    """The training page's default run (``EncoderRun``: 2 layers, 4 heads, d_model 32, sinusoidal
    positions, Adam at 3e-3 decaying to a tenth, batches of 64, 300 steps), deterministic by seed
    and ``track`` (the readable or the compiled training step: the same to rounding), which its
    ``origin`` names."""
    spec = _spec(task, seed, n_train, n_val, n_test, steps)
    cfg = spec.config()
    data = make_dataset(task, spec.n_train, spec.n_val, spec.n_test, seed=spec.seed)
    state = new_state(cfg, data, seed=spec.seed, lr=spec.lr, batch_size=spec.batch_size, decay_steps=spec.steps)
    for _ in train(state, data, max_steps=spec.steps, eval_every=spec.steps, track=track):
        pass
    params = {name: value.copy() for name, value in state.params.items()}
    return TrainedEncoder(params, cfg, data, _origin(spec, track))


def default_model(task: str = "sum", seed: int = 0, *, n_train: int = 4000, n_val: int = 1000,
                  n_test: int = 1000, steps: int | None = None, track: str = DEFAULT_TRACK) -> TrainedEncoder:
    """:func:`train_default`'s model, read from the file shipped with the app when that run is the
    shipped one (:mod:`core.training.shipped`: the default task, seed 0), trained here otherwise."""
    spec = _spec(task, seed, n_train, n_val, n_test, steps)

    def read(params, run):
        data = make_dataset(task, spec.n_train, spec.n_val, spec.n_test, seed=spec.seed)
        return TrainedEncoder(params, spec.config(), data, _origin(spec, run["track"]) + " and shipped with the app")

    return shipped.load_or_train(shipped.ENCODER_FILE, dataclasses.asdict(spec), read=read, train=lambda: train_default(
        task, seed, n_train=n_train, n_val=n_val, n_test=n_test, steps=steps, track=track))
