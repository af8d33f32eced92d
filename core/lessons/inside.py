"""Inside a trained encoder: one example followed sublayer by sublayer, and heads removed one at a
time to see what the model's accuracy really depends on.

Every number comes from the one transformer's forward cache (:func:`core.model.transformer.forward`,
the readable forward pass, which keeps what it computes under the names of the project's one
vocabulary: ``blocks.{i}.attn.weights``, ``blocks.{i}.ln1.input`` ...). The encoder is a setting of
that transformer (:func:`core.model.presets.encoder_classifier`), its parameters named in the same
vocabulary (``blocks.{i}.ln1.g``, ``classifier.W`` ...). This module only selects from the
cache, summarises it (means, standard deviations, fractions) and scores forward passes with heads
edited (``forward(..., ablate=...)``). No layer is recomputed here.

    model = train_default("sum", seed=0)                        # or a model from the training page
    logits, cache = forward(model.params, model.cfg, model.data.X_test[:1])
    steps = walkthrough(cache, model.params, model.cfg, layer=0)
    report = head_ablation(model.params, model.cfg, model.data.X_test, model.data.y_test)

Lesson: attention maps are diagnostics, not explanations. A head whose map looks striking may be
one the classifier hardly needs; the ablation table measures it.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from core.lessons.analysis import row_entropy_bits
from core.model import names, transformer
from core.model.config import TransformerConfig
from core.recording import Record, recorded, recording
# the model the page opens on is trained (or read from the file shipped with the app) in core.training
from core.training.encoder_runs import TrainedEncoder as Model, default_model, train_default  # noqa: F401

ABLATION_MODES = ("zero", "mean")
BATCH = 256            # sequences per forward pass when scoring a test set (bounds the cache's memory)


@recorded
def forward(params: dict, cfg: TransformerConfig, tokens, ablate: dict | None = None):
    """The encoder run as the one transformer (its readable forward pass): ``(logits (B, C), cache)``,
    the cache named as :func:`core.model.transformer.forward` says."""
    return transformer.forward(params, cfg, tokens, ablate=ablate)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose arg-max is the label (ties to the lower class, as the kernels count)."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))


# ----------------------------------------------------------------------------------------------
# 1. one example, sublayer by sublayer
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    """One arrow of the walkthrough: what was computed, its shape written out, and the arrays,
    each under its name in the cache (``blocks.0.ln1.input``) or among the parameters
    (``blocks.0.ln1.g``)."""

    name: str
    shape: str              # e.g. "(T, d_model) = (16, 32)"
    arrays: dict            # cache or parameter name -> array for this example


def shape_label(symbols: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    """``(("T", "d_model"), (16, 32)) -> "(T, d_model) = (16, 32)"``."""
    if len(symbols) != len(sizes):
        raise ValueError(f"{len(symbols)} axis names for {len(sizes)} sizes.")
    return f"({', '.join(symbols)}) = ({', '.join(str(int(s)) for s in sizes)})"


@recorded
def walkthrough(cache: dict, params: dict, cfg: TransformerConfig, layer: int, example: int = 0) -> list[Step]:
    """Example ``example`` of ``cache`` (from :func:`forward`) through block ``layer`` (0-based), one
    :class:`Step` per sublayer of the post-norm block

        x -> attention -> LN1(x + attention) -> FFN -> LN2(x + FFN)

    every array the cache entry of that name (or a LayerNorm's gain and bias, from the parameters)."""
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"The model has layers 1 to {cfg.n_layers}; layer {layer + 1} does not exist.")
    n = cache["tokens"].shape[0]
    if not 0 <= example < n:
        raise ValueError(f"The cache holds examples 0 to {n - 1}; example {example} is not one of them.")
    T, d, H, F, C = cache["tokens"].shape[1], cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_classes
    b = names.block(layer) + "."

    def entries(*keys):
        return {k: cache[k] if k == "pos_embed" else cache[k][example] for k in keys}

    def layer_norm(ln):
        out = f"{b}resid_mid" if ln == "ln1" else f"{b}resid_post"         # post-norm: LN's output is the residual stream
        return {**entries(*(f"{b}{ln}.{s}" for s in ("input", "mean", "std", "normalized")), out),
                f"{b}{ln}.g": params[f"{b}{ln}.g"], f"{b}{ln}.b": params[f"{b}{ln}.b"]}

    td, tf = shape_label(("T", "d_model"), (T, d)), shape_label(("T", "d_ff"), (T, F))
    return [
        Step("embeddings + positions", td, entries("token_embed", "pos_embed", "blocks.0.resid_pre")),
        Step(f"layer {layer + 1} input x", td, entries(f"{b}resid_pre")),
        Step("attention weights", shape_label(("H", "T", "T"), (H, T, T)), entries(f"{b}attn.weights")),
        Step("heads' outputs, concatenated", td, entries(f"{b}attn.concat")),
        Step("attention output concat W_O + b_O", td, entries(f"{b}attn.output")),
        Step("residual sum x + attention", td, entries(f"{b}ln1.input")),
        Step("LayerNorm 1", td, layer_norm("ln1")),
        Step("FFN hidden relu(x W_1 + b_1)", tf, entries(f"{b}ffn.pre", f"{b}ffn.hidden")),
        Step("FFN output hidden W_2 + b_2", td, entries(f"{b}ffn.output")),
        Step("residual sum x + FFN", td, entries(f"{b}ln2.input")),
        Step("LayerNorm 2", td, layer_norm("ln2")),
        Step("mean over positions (after the last layer)", shape_label(("d_model",), (d,)), entries("pooled")),
        Step("logits pooled classifier.W + classifier.b", shape_label(("classes",), (C,)), entries("logits")),
    ]


@recorded
def layernorm_table(step: Step) -> dict[str, np.ndarray]:
    """Per token (T,), from a LayerNorm :class:`Step`: the input's mean, standard deviation and the
    divisor ``sqrt(var + eps)``; the normalised input's mean and standard deviation (0 and just under
    1: ``sqrt(var / (var + eps))``); the output's after gain and bias."""
    a = {name.rsplit(".", 1)[-1]: value for name, value in step.arrays.items()}
    out = a["resid_mid"] if "resid_mid" in a else a["resid_post"]
    return {"mean before": a["mean"], "std before": a["input"].std(axis=-1),
            "sqrt(var + eps) before": a["std"],
            "mean of x-hat": a["normalized"].mean(axis=-1), "std of x-hat": a["normalized"].std(axis=-1),
            "mean after gain and bias": out.mean(axis=-1), "std after gain and bias": out.std(axis=-1)}


@recorded
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
    head_means: np.ndarray          # (L, H, T, d_k) mean of each head's output over the test set

    def change(self, mode: str) -> np.ndarray:
        """Change in test accuracy, (L, H), when each head alone is removed."""
        return self.accuracy[mode] - self.baseline


def check_heads(heads, cfg: TransformerConfig) -> list[tuple[int, int]]:
    """``heads`` as a list of ``(layer, head)`` pairs (0-based), each one of the model's."""
    out = []
    for layer, head in heads:
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise ValueError(f"Layer {layer + 1}, head {head + 1} is not in this model "
                             f"({cfg.n_layers} layers of {cfg.n_heads} heads).")
        out.append((int(layer), int(head)))
    return out


def clean_statistics(params: dict, cfg: TransformerConfig, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From the intact model's forward caches over ``X``, in batches: the logits (n, C), the mean
    attention map of every head (L, H, T, T) and the mean of every head's output (L, H, T, d_k)."""
    logits, maps, means = [], 0.0, 0.0
    for b0 in range(0, len(X), BATCH):
        z, cache = forward(params, cfg, X[b0:b0 + BATCH])
        logits.append(z)
        maps = maps + np.stack([w.sum(axis=0, dtype=np.float64)
                                for w in names.per_block(cache, cfg.n_layers, "attn", "weights")])  # (L, H, T, T)
        means = means + np.stack([z.sum(axis=0, dtype=np.float64)
                                  for z in names.per_block(cache, cfg.n_layers, "attn", "head_outputs")])
    return np.concatenate(logits), maps / len(X), means / len(X)


def ablated_logits(params: dict, cfg: TransformerConfig, X: np.ndarray, heads, mode: str = "zero",
                   head_means: np.ndarray | None = None) -> np.ndarray:
    """Logits (n, C) with every ``(layer, head)`` of ``heads`` removed: its output, before ``W_O``,
    replaced by 0 (``mode="zero"``) or by its mean over the data set at each position (``"mean"``,
    from ``head_means``, :attr:`HeadReport.head_means`)."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"The ablation is one of {', '.join(ABLATION_MODES)}, got {mode!r}.")
    if mode == "mean" and head_means is None:
        raise ValueError("Mean ablation needs the heads' mean outputs (head_means).")
    edits = {(i, h): "zero" if mode == "zero" else head_means[i, h] for i, h in check_heads(heads, cfg)}
    return np.concatenate([forward(params, cfg, X[b0:b0 + BATCH], ablate=edits)[0]
                           for b0 in range(0, len(X), BATCH)])


@recorded
def ablated_accuracy(params: dict, cfg: TransformerConfig, X: np.ndarray, y: np.ndarray, heads, mode: str = "zero",
                     head_means: np.ndarray | None = None) -> float:
    """Test accuracy with ``heads`` removed (:func:`ablated_logits`)."""
    return accuracy(ablated_logits(params, cfg, X, heads, mode, head_means), y)


@recorded
def head_ablation(params: dict, cfg: TransformerConfig, X: np.ndarray, y: np.ndarray) -> HeadReport:
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


@recorded
def most_focused(report: HeadReport) -> int:
    """The head whose test-set mean map is the most focused, as a flat index ``layer * H + head``."""
    return int(np.argmax(report.focus))


@recorded
def largest_drop(change: np.ndarray) -> int | None:
    """The flat index of the head whose removal lowers the accuracy most, or None when removing no
    single head lowers it (every change >= 0)."""
    flat = np.ravel(change)
    worst = int(np.argmin(flat))
    return worst if flat[worst] < 0 else None


FALLS_MOST, FALLS_LESS, NO_FALL = 0, 1, 2      # what removing the most focused head does to the accuracy


@recorded
def focused_head_outcome(report: HeadReport, mode: str = "zero") -> int:
    """What removing the most focused head (:func:`most_focused`) does to the test accuracy:
    :data:`FALLS_MOST` (it falls, and removing no other single head lowers it more),
    :data:`FALLS_LESS` (it falls, but removing some other head lowers it more) or :data:`NO_FALL`."""
    change = report.change(mode).ravel()
    mine = change[most_focused(report)]
    if mine >= 0:
        return NO_FALL
    return FALLS_MOST if mine <= change.min() else FALLS_LESS


@functools.lru_cache(maxsize=1)
def opening_model() -> tuple[Model, HeadReport, Record]:
    """The model the page "Inside a trained model" opens on (:func:`default_model`: 'sum', seed 0,
    shipped with the app), its :func:`head_ablation` report and the record of what computed it (the
    page's source shows it): computed once per process, for the opening question and the page."""
    model = default_model()
    with recording() as ran:
        report = head_ablation(model.params, model.cfg, model.data.X_test, model.data.y_test)
    return model, report, ran


@recorded
def head_averaged_attention(cache: dict, layer: int, example: int) -> np.ndarray:
    """(T, T): the attention weights of ``layer`` for ``example``, averaged over the heads (as
    PyTorch's ``average_attn_weights=True``); ``cache`` from :func:`forward`."""
    return cache[names.key(names.block(layer), "attn", "weights")][example].mean(axis=0)


# ----------------------------------------------------------------------------------------------
# 3. pooling: the mean over positions, or one position read alone ([CLS]-style)
# ----------------------------------------------------------------------------------------------
def position_logits(cache: dict, params: dict, cfg: TransformerConfig) -> np.ndarray:
    """(B, T, C): the classifier applied to each position's vector after the last layer alone,
    ``x_t W + b`` (``classifier.W``, ``classifier.b``). Their mean over positions is the model's
    logits (the classifier is linear, so mean pooling averages these)."""
    return cache[names.key(names.block(cfg.n_layers - 1), "resid_post")] @ params["classifier.W"] + params["classifier.b"]


@recorded
def pooling_accuracy(cache: dict, params: dict, cfg: TransformerConfig, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Test accuracy with mean pooling (the model as trained) and, (T,), with the classifier
    reading a single position instead, as a [CLS] readout would."""
    single = [accuracy(z, y) for z in position_logits(cache, params, cfg).transpose(1, 0, 2)]   # one per position
    return accuracy(cache["logits"], y), np.array(single)
