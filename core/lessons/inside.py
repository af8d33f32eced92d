"""Inside a trained encoder: one example followed sublayer by sublayer, and heads removed one at a
time to see what the model's accuracy really depends on.

Every number comes from the encoder's forward cache (:func:`core.models.encoder.forward_cache`, the
compiled forward pass with its intermediates kept): this module only selects from it, summarises
it (means, standard deviations, fractions) and scores ablated forward passes
(:func:`core.models.encoder.forward_ablated`). No layer is recomputed here.

    model = train_default("sum", seed=0)                        # or a model from the training page
    logits, cache = encoder.forward_cache(model.params, model.data.X_test[:1], model.cfg)
    steps = walkthrough(cache, model.params, model.cfg, layer=0)
    report = head_ablation(model.params, model.cfg, model.data.X_test, model.data.y_test)

Lesson: attention maps are diagnostics, not explanations. A head whose map looks striking may be
one the classifier hardly needs; the ablation table measures it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.lessons.analysis import row_entropy_bits
from core.models import encoder, training
from core.models.encoder import EncoderConfig
from core.models.runs import RunSpec
from core.models.tasks import Dataset, make_dataset

ABLATION_MODES = ("zero", "mean")
BATCH = 256            # sequences per forward pass when scoring a test set (bounds the cache's memory)


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Model:
    """A trained encoder, the data it was trained and tested on, and how it came about."""

    params: dict
    cfg: EncoderConfig
    data: Dataset
    origin: str


def train_default(task: str = "sum", seed: int = 0, *, n_train: int = 4000, n_val: int = 1000,
                  n_test: int = 1000, steps: int | None = None) -> Model:
    """The training page's default run (``RunSpec``: 2 layers, 4 heads, d_model 32, sinusoidal
    positions, Adam at 3e-3 decaying to a tenth, batches of 64, 300 steps), deterministic by seed."""
    spec = RunSpec(task=task, seed=int(seed), n_train=n_train, n_val=n_val, n_test=n_test,
                   **({} if steps is None else {"steps": int(steps)})).check()
    cfg = spec.config()
    data = make_dataset(task, spec.n_train, spec.n_val, spec.n_test, seed=spec.seed)
    state = training.new_state(cfg, data, seed=spec.seed, lr=spec.lr, batch_size=spec.batch_size,
                               decay_steps=spec.steps)
    for _ in training.train(state, data, max_steps=spec.steps, eval_every=spec.steps):
        pass
    params = {name: value.copy() for name, value in state.params.items()}
    return Model(params, cfg, data, f"default model: {spec.steps} steps on '{task}', seed {spec.seed}")


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose arg-max is the label (ties to the lower class, as the kernels count)."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))


# ----------------------------------------------------------------------------------------------
# 1. one example, sublayer by sublayer
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    """One arrow of the walkthrough: what was computed, its shape written out, and the arrays."""

    name: str
    shape: str              # e.g. "(T, d_model) = (16, 32)"
    arrays: dict            # name -> array for this example, read from the cache


def shape_label(symbols: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    """``(("T", "d_model"), (16, 32)) -> "(T, d_model) = (16, 32)"``."""
    if len(symbols) != len(sizes):
        raise ValueError(f"{len(symbols)} axis names for {len(sizes)} sizes.")
    return f"({', '.join(symbols)}) = ({', '.join(str(int(s)) for s in sizes)})"


def walkthrough(cache: dict, params: dict, cfg: EncoderConfig, layer: int, example: int = 0) -> list[Step]:
    """Example ``example`` of ``cache`` through layer ``layer`` (0-based), one :class:`Step` per
    sublayer, every array a slice of the cache (or a parameter: LayerNorm's gain and bias)."""
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"The model has layers 1 to {cfg.n_layers}; layer {layer + 1} does not exist.")
    n = cache["tokens"].shape[0]
    if not 0 <= example < n:
        raise ValueError(f"The cache holds examples 0 to {n - 1}; example {example} is not one of them.")
    T, d, H, F, C = cache["tokens"].shape[1], cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_classes
    at = lambda name: cache[f"layers.{layer}.{name}"][example]  # noqa: E731
    td, tf = shape_label(("T", "d_model"), (T, d)), shape_label(("T", "d_ff"), (T, F))
    p = f"layers.{layer}."
    return [
        Step("embeddings + positions", td, {"token embeddings": cache["tok_embed"][example],
                                             "positions": cache["pos_embed"],
                                             "sum": cache["layers.0.resid_pre"][example]}),
        Step(f"layer {layer + 1} input h", td, {"h": at("resid_pre")}),
        Step("attention weights", shape_label(("H", "T", "T"), (H, T, T)), {"weights": at("weights")}),
        Step("heads' outputs, concatenated", td, {"concat": at("concat")}),
        Step("attention output concat W_O + b_O", td, {"attn_out": at("attn_out")}),
        Step("residual sum h + attention", td, {"ln1_in": at("ln1_in")}),
        Step("LayerNorm 1", td, {"in": at("ln1_in"), "xhat": at("ln1_xhat"), "out": at("ln1_out"),
                                 "mean": at("ln1_mean"), "rstd": at("ln1_rstd"),
                                 "gain": params[p + "ln1_g"], "bias": params[p + "ln1_b"]}),
        Step("FFN hidden relu(x W_1 + b_1)", tf, {"pre": at("ffn_pre"), "hidden": at("ffn_hidden")}),
        Step("FFN output hidden W_2 + b_2", td, {"ffn_out": at("ffn_out")}),
        Step("residual sum x + FFN", td, {"ln2_in": at("ln2_in")}),
        Step("LayerNorm 2", td, {"in": at("ln2_in"), "xhat": at("ln2_xhat"), "out": at("ln2_out"),
                                 "mean": at("ln2_mean"), "rstd": at("ln2_rstd"),
                                 "gain": params[p + "ln2_g"], "bias": params[p + "ln2_b"]}),
        Step("mean over positions (after the last layer)", shape_label(("d_model",), (d,)),
             {"pooled": cache["pooled"][example]}),
        Step("logits pooled W_cls + b_cls", shape_label(("classes",), (C,)), {"logits": cache["logits"][example]}),
    ]


def layernorm_table(step: Step) -> dict[str, np.ndarray]:
    """Per token (T,), from a LayerNorm :class:`Step`: the input's mean (the kernel's), standard
    deviation and the kernel's divisor ``sqrt(var + eps) = 1 / rstd``; the normalised ``xhat``'s
    mean and standard deviation (0 and just under 1: ``sqrt(var / (var + eps))``); the output's
    after gain and bias."""
    a = step.arrays
    return {"mean before": a["mean"], "std before": a["in"].std(axis=-1),
            "sqrt(var + eps) before": 1.0 / a["rstd"],
            "mean of x-hat": a["xhat"].mean(axis=-1), "std of x-hat": a["xhat"].std(axis=-1),
            "mean after gain and bias": a["out"].mean(axis=-1), "std after gain and bias": a["out"].std(axis=-1)}


def relu_off_fraction(hidden: np.ndarray) -> np.ndarray:
    """Per token, the fraction of the FFN's ReLUs that output 0 (``hidden`` (..., T, d_ff))."""
    return np.mean(np.asarray(hidden) == 0, axis=-1)


# ----------------------------------------------------------------------------------------------
# 2. head ablation
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HeadReport:
    """What the test set says about each head (L, H arrays unless stated)."""

    baseline: float                 # test accuracy of the intact model
    accuracy: dict                  # mode -> (L, H) test accuracy with that one head removed
    mean_maps: np.ndarray           # (L, H, T, T) each head's attention averaged over the test set
    focus: np.ndarray               # (L, H) 1 - mean row entropy / log2 T of the mean map: 0 uniform, 1 one-hot
    head_means: np.ndarray          # (L, T, d) mean of the heads' outputs (concat) over the test set

    def change(self, mode: str) -> np.ndarray:
        """Change in test accuracy, (L, H), when each head alone is removed."""
        return self.accuracy[mode] - self.baseline


def head_scale_for(heads, cfg: EncoderConfig) -> np.ndarray:
    """(L, H) scales: 0 for each ``(layer, head)`` (0-based) in ``heads``, 1 elsewhere."""
    scale = np.ones((cfg.n_layers, cfg.n_heads))
    for layer, head in heads:
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise ValueError(f"Layer {layer + 1}, head {head + 1} is not in this model "
                             f"({cfg.n_layers} layers of {cfg.n_heads} heads).")
        scale[layer, head] = 0.0
    return scale


def clean_statistics(params: dict, cfg: EncoderConfig, X: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """From the intact model's forward caches over ``X``, in batches: the logits (n, C), the mean
    attention map of every head (L, H, T, T) and the mean of the heads' outputs (L, T, d)."""
    logits, maps, means = [], 0.0, 0.0
    for b0 in range(0, len(X), BATCH):
        z, cache = encoder.forward_cache(params, X[b0:b0 + BATCH], cfg)
        logits.append(z)
        maps = maps + cache["attn"].sum(axis=1, dtype=np.float64)                   # (L, H, T, T)
        means = means + np.stack([cache[f"layers.{i}.concat"].sum(axis=0, dtype=np.float64)
                                  for i in range(cfg.n_layers)])                    # (L, T, d)
    return np.concatenate(logits), maps / len(X), means / len(X)


def ablated_accuracy(params: dict, cfg: EncoderConfig, X: np.ndarray, y: np.ndarray, heads, mode: str = "zero",
                     head_means: np.ndarray | None = None) -> float:
    """Test accuracy with every ``(layer, head)`` of ``heads`` removed: its output replaced by 0
    (``mode="zero"``) or by its mean over the data set (``"mean"``, from ``head_means``)."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"The ablation is one of {', '.join(ABLATION_MODES)}, got {mode!r}.")
    if mode == "mean" and head_means is None:
        raise ValueError("Mean ablation needs the heads' mean outputs (head_means).")
    scale = head_scale_for(heads, cfg)
    fill = head_means if mode == "mean" else None
    logits = np.concatenate([encoder.forward_ablated(params, X[b0:b0 + BATCH], cfg, scale, fill)
                             for b0 in range(0, len(X), BATCH)])
    return accuracy(logits, y)


def head_ablation(params: dict, cfg: EncoderConfig, X: np.ndarray, y: np.ndarray) -> HeadReport:
    """Remove each head alone, both ways, and score the test set (2 L H + 1 forward passes)."""
    X = np.ascontiguousarray(X, dtype=np.int64)
    logits, maps, means = clean_statistics(params, cfg, X)
    T = X.shape[1]
    entropy = row_entropy_bits(maps).mean(axis=-1)                                   # (L, H)
    focus = 1.0 - entropy / np.log2(T) if T > 1 else np.zeros_like(entropy)
    acc = {mode: np.array([[ablated_accuracy(params, cfg, X, y, [(i, h)], mode, means)
                            for h in range(cfg.n_heads)] for i in range(cfg.n_layers)])
           for mode in ABLATION_MODES}
    return HeadReport(accuracy(logits, y), acc, maps, focus, means)


def head_averaged_attention(cache: dict, layer: int, example: int) -> np.ndarray:
    """(T, T): the attention weights of ``layer`` for ``example``, averaged over the heads (as
    PyTorch's ``average_attn_weights=True``); ``cache`` from ``forward`` or ``forward_cache``."""
    return cache["attn"][layer, example].mean(axis=0)


# ----------------------------------------------------------------------------------------------
# 3. pooling: the mean over positions, or one position read alone ([CLS]-style)
# ----------------------------------------------------------------------------------------------
def position_logits(cache: dict, params: dict) -> np.ndarray:
    """(B, T, C): the classifier applied to each position's final hidden state alone,
    ``hidden[:, t] W_cls + b_cls``. Their mean over positions is the model's logits (the
    classifier is linear, so mean pooling averages these)."""
    return cache["hidden"] @ params["W_cls"] + params["b_cls"]


def pooling_accuracy(cache: dict, params: dict, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Test accuracy with mean pooling (the model as trained) and, (T,), with the classifier
    reading a single position instead, as a [CLS] readout would."""
    single = [accuracy(z, y) for z in position_logits(cache, params).transpose(1, 0, 2)]     # one per position
    return accuracy(cache["logits"], y), np.array(single)
