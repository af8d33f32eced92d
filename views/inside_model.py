"""Inside a trained model: one example through a layer, sublayer by sublayer, and heads removed to
see what the accuracy really depends on."""
import hashlib

import numpy as np
import pandas as pd
import streamlit as st

from core import limits
from core.lessons import inside
from core.lessons.analysis import row_entropy_bits
from core.recording import Record, recording
from core.lessons.questions import inside_model as questions
from core.model import names
from core.model.tuned import classifier
from core.training import tasks
from core import warmup
from ui import charts, lesson, state, widgets


PAGE = "inside_model"
SPEC = {
    "source": state.choice_field("default", ("default", "trained")),
    "task": state.choice_field("sum", tuple(tasks.TASKS)),
    "seed": state.int_field(0, 0, 999),
    "example": state.int_field(0, 0, 99_999),
    "layer": state.int_field(1, 1, limits.MAX_TRAIN_LAYERS),
    "mode": state.choice_field("zero", inside.ABLATION_MODES),
    "show": state.text_field(""),
    "remove": state.text_field(""),
}
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state
# test hooks: tiny data sets and step counts for the default model
SIZES_KEY, STEPS_KEY = k("data_sizes"), k("steps")
TRAINER_KEY = "training.trainer"          # the "Train an encoder" page's worker (ui/trainer.py)

st.title("Inside a trained model")
state.restore(PAGE, SPEC)
lesson.header("inside_model")
unlocked = lesson.predict("inside_model")  # opens the heads' removal (section 2)
st.markdown(
    "A trained encoder taken apart. First one test sequence is followed through a layer, sublayer by "
    "sublayer, with the shape of every arrow; then heads are removed to measure what the model's "
    "accuracy depends on. Every number comes from the model's **forward cache**: the readable forward "
    "pass keeps what it computes under one name per array (`blocks.0.attn.weights`, `blocks.0.ln1.input`, …), "
    "and each arrow below names the entry it draws.")


# 0. the model ----------------------------------------------------------------------------------
@st.cache_resource(show_spinner="Loading the model shipped with the app, or training this one (a few seconds, once per task "
                                "and seed)…", max_entries=8)
def default_model(task: str, seed: int, sizes: tuple, steps) -> inside.Model:
    """The shipped model for the default run; any other trained once per server on the compiled step,
    or on the readable one while a freshly started server still compiles it; the model's origin says
    which (every session then shares it)."""
    return inside.default_model(task, seed, n_train=sizes[0], n_val=sizes[1], n_test=sizes[2], steps=steps,
                                track=warmup.track(warmup.ENCODER))


@st.cache_resource(max_entries=8)
def task_data(task: str, sizes: tuple, seed: int) -> tasks.Dataset:
    return tasks.make_dataset(task, *sizes, seed=seed)


@st.cache_resource(show_spinner="Removing each head in turn and scoring the test set…", max_entries=8)
def head_report(key: str, _model: inside.Model):
    """Each head removed in turn, and the record of what computed it (the opening model's once per
    process: its question's numbers, computed when the page's questions were imported)."""
    opening, report, ran = inside.opening_model()
    if key == model_key(opening):
        return report, ran
    with recording() as ran:
        report = inside.head_ablation(_model.params, _model.cfg, _model.data.X_test, _model.data.y_test)
    return report, ran


@st.cache_resource(max_entries=8)
def pooling(key: str, _model: inside.Model):
    """The classifier read from the mean and from each position, and the record of what computed it."""
    with recording() as ran:
        _, cache = inside.forward(_model.params, _model.cfg, _model.data.X_test)
        accuracies = inside.pooling_accuracy(cache, _model.params, _model.cfg, _model.data.y_test)
    return accuracies, ran


@st.cache_resource(max_entries=64)
def several_removed(key: str, heads: tuple, mode: str, _model: inside.Model, _means):
    """The test accuracy with ``heads`` removed together, and the record of what computed it."""
    with recording() as ran:
        accuracy = inside.ablated_accuracy(_model.params, _model.cfg, _model.data.X_test, _model.data.y_test,
                                           list(heads), mode, _means)
    return accuracy, ran


def bar_chart(spec: dict) -> None:
    """A bar chart with its title written above it: a fixed-height bar chart with rotated labels
    draws its Vega title above its own box, where a table just above it covered the title."""
    title = spec.pop("title", "")
    if title:
        st.markdown(f"**{title}**")
    st.vega_lite_chart(spec)


def model_key(model: inside.Model) -> str:
    """Names a model by its numbers and data, so cached analyses follow the model, not the session."""
    digest = hashlib.sha1(classifier.flatten(model.params, model.cfg).tobytes())
    digest.update(repr((model.cfg, model.data.task)).encode())
    digest.update(model.data.X_test.tobytes())
    return digest.hexdigest()


def finished_run():
    """The training page's model when it holds a finished (or uploaded) run, else None."""
    trainer = ss.get(TRAINER_KEY)
    if trainer is None or trainer.status not in ("done", "loaded"):
        return None
    view = trainer.view()
    params, cfg = trainer.params(0)
    spec = view.runs[0].spec
    data = task_data(spec.task, (spec.n_train, spec.n_val, spec.n_test), spec.seed)
    return inside.Model(params, cfg, data, f"your run from “Train an encoder”: {view.runs[0].step} steps "
                                           f"on '{spec.task}'")


st.header("0. The model")
try:
    trained = finished_run()
except ValueError as err:
    trained = None
    st.warning(f"The training page's model could not be read: {err}")
c = st.columns(3)
if trained is not None:
    c[0].radio("Model", ("default", "trained"), key=k("source"), horizontal=True,
               format_func={"default": "default model", "trained": "your trained run"}.get)
else:
    c[0].caption("A finished run on the “Train an encoder” page can be taken apart here too.")
if trained is None and ss[k("source")] == "trained":
    st.info("The “Train an encoder” page holds no finished run in this session: using the default model.")
    if state.from_link(PAGE, "source") is not None:        # a link cannot carry a run: the address drops it
        state.settle(PAGE, "source", "default", "a link cannot carry a run from “Train an encoder”.")
use_trained = trained is not None and ss[k("source")] == "trained"
c[1].selectbox("Task of the default model", tuple(tasks.TASKS), key=k("task"), disabled=use_trained)
state.whole_number_input(c[2], "Seed of the default model (0 to 999)", 0, 999, key=k("seed"), disabled=use_trained)
try:
    model = trained if use_trained else default_model(ss[k("task")], int(ss[k("seed")]),
                                                      tuple(ss.get(SIZES_KEY, (4000, 1000, 1000))),
                                                      ss.get(STEPS_KEY))
except ValueError as err:
    st.error(str(err))
    st.stop()
cfg, data, key = model.cfg, model.data, model_key(model)
X, y = data.X_test, data.y_test
st.caption(f"Using the {model.origin}: {cfg.n_layers} layers, {cfg.n_heads} heads, d_model {cfg.d_model}, "
           f"d_ff {cfg.d_ff}, {cfg.positional} positions; task: {tasks.describe(data.task)}")

# 1. one example, sublayer by sublayer ----------------------------------------------------------
st.header("1. One example through one layer")
n_test, L = len(y), cfg.n_layers
if ss[k("example")] > n_test - 1:
    state.settle(PAGE, "example", n_test - 1, f"the test set has {n_test} examples, 0 to {n_test - 1}.")
if ss[k("layer")] > L:
    state.settle(PAGE, "layer", L, f"this model has {L} layer{'s' if L > 1 else ''}.")
c = st.columns(2)
state.whole_number_input(c[0], f"Test example (0 to {n_test - 1})", 0, n_test - 1, key=k("example"))
if L > 1:
    c[1].slider("Layer", 1, L, key=k("layer"))
example, layer = int(ss[k("example")]), int(ss[k("layer")]) - 1
ran = Record()                     # what computes the numbers below, for the source at the end of the page
with recording(ran):
    _, cache = inside.forward(model.params, cfg, X[example:example + 1])
    steps = {s.name: s for s in inside.walkthrough(cache, model.params, cfg, layer, 0)}
tokens = X[example]
T = len(tokens)
rows = [f"{t + 1}:{tok}" for t, tok in enumerate(tokens)]
feat = lambda n: [str(j + 1) for j in range(n)]  # noqa: E731
blk = names.block(layer) + "."               # this layer's entries in the cache
st.markdown(f"Tokens `{' '.join(map(str, tokens))}`, label **{y[example]}**. Each arrow below writes out its "
            "shape and names the cache entries it shows.")


def arrow(number: int, step: inside.Step, note: str = "") -> None:
    entries = ", ".join(f"`{name}`" for name in step.arrays)
    st.markdown(f"**{number}. {step.name}** → `{step.shape}`{'  ' + note if note else ''}")
    st.caption(f"from {entries}")


def signed(matrix, title: str, value: str = "value", cols=None) -> None:
    st.vega_lite_chart(charts.heatmap(matrix, rows, cols or feat(np.shape(matrix)[1]), title=title, kind="signed",
                                      value_name=value, row_title="token", col_title="feature", annotate=False,
                                      size=420))


s = steps["embeddings + positions"]
arrow(1, s, "(token embedding + position; the layer-1 input)")
a, b = st.columns(2)
with a:
    signed(s.arrays["token_embed"], "token embeddings E[tok_t]")
with b:
    signed(s.arrays["blocks.0.resid_pre"], "E[tok_t] + PE_t")
s = steps[f"layer {layer + 1} input x"]
arrow(2, s, "" if layer == 0 else f"(the output of layer {layer})")
s = steps["attention weights"]
arrow(3, s)
st.vega_lite_chart(charts.heatmap_grid(list(s.arrays[f"{blk}attn.weights"]), rows, rows,
                                       [f"head {h + 1}" for h in range(cfg.n_heads)],
                                       columns=min(cfg.n_heads, 4), size=170, annotate=False))
left, right = st.columns(2)
with left:
    arrow(4, steps["heads' outputs, concatenated"])
    signed(steps["heads' outputs, concatenated"].arrays[f"{blk}attn.concat"], "concat")
with right:
    arrow(5, steps["attention output concat W_O + b_O"])
    signed(steps["attention output concat W_O + b_O"].arrays[f"{blk}attn.output"], "MHA(x)")
st.latex(r"r_1 = x + \mathrm{MHA}(x), \qquad \mathrm{LN}(r)_t = g \odot \frac{r_t - \mu_t}{\sqrt{\sigma_t^2 + "
         r"\varepsilon}} + b, \quad \mu_t = \tfrac{1}{d}\textstyle\sum_j r_{tj},\; "
         r"\sigma_t^2 = \tfrac{1}{d}\sum_j (r_{tj} - \mu_t)^2")


def layernorm(number: int, name: str, ln: str, answered: bool) -> None:
    step = steps[name]
    arrow(number, step, f"(ε = {cfg.ln_eps:g})")
    with recording(ran):
        table = pd.DataFrame({"token": rows, **inside.layernorm_table(step)})
    st.dataframe(table, hide_index=True, key=k(f"table_{name}"),
                 column_config={c: st.column_config.NumberColumn(format="%.6f") for c in table.columns[1:]})
    st.caption("x-hat is the residual sum normalised, before the gain and bias: mean 0"
               + (", and a standard deviation of √(σ²/(σ²+ε)), a hair under 1." if answered else ".")
               + " The gain and bias then give each feature its own scale and offset.")
    left, right = st.columns(2)
    with left:
        bar_chart(charts.bar(step.arrays[f"{blk}{ln}.g"], feat(cfg.d_model), title="learned gain g",
                             x_title="feature", y_title="gain", y_domain=None))
    with right:
        bar_chart(charts.bar(step.arrays[f"{blk}{ln}.b"], feat(cfg.d_model), title="learned bias b",
                             x_title="feature", y_title="bias", y_domain=None))


left, right = st.columns(2)
with left:
    arrow(6, steps["residual sum x + attention"])
    signed(steps["residual sum x + attention"].arrays[f"{blk}ln1.input"], "r₁ = x + MHA(x)")
with right:
    signed(steps["LayerNorm 1"].arrays[f"{blk}resid_mid"], "LN₁(r₁)")
ln_answered = lesson.ask(questions.LAYERNORM)
layernorm(7, "LayerNorm 1", "ln1", ln_answered)
s = steps["FFN hidden relu(x W_1 + b_1)"]
with recording(ran):
    off = inside.relu_off_fraction(s.arrays[f"{blk}ffn.hidden"])
arrow(8, s)
st.latex(r"\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2")
m = st.columns(2)
m[0].metric("ReLUs off (output 0), over all tokens", f"{off.mean():.1%}")
m[1].metric("Tokens with more than half off", f"{int((off > 0.5).sum())} of {T}")
signed(s.arrays[f"{blk}ffn.hidden"], "relu(x W₁ + b₁)", "activation")
left, right = st.columns(2)
with left:
    arrow(9, steps["FFN output hidden W_2 + b_2"])
    signed(steps["FFN output hidden W_2 + b_2"].arrays[f"{blk}ffn.output"], "FFN(x)")
with right:
    arrow(10, steps["residual sum x + FFN"])
    signed(steps["residual sum x + FFN"].arrays[f"{blk}ln2.input"], "r₂ = x + FFN(x)")
layernorm(11, "LayerNorm 2", "ln2", ln_answered)
signed(steps["LayerNorm 2"].arrays[f"{blk}resid_post"], f"the output of layer {layer + 1}")
s, z = steps["mean over positions (after the last layer)"], steps["logits pooled classifier.W + classifier.b"]
arrow(12, s, f"(the mean of layer {L}'s output over the {T} positions)")
st.latex(r"\bar x = \tfrac{1}{T}\textstyle\sum_t x^{(L)}_t, \qquad z = \bar x\, W_{\mathrm{cls}} + b_{\mathrm{cls}}")
bar_chart(charts.bar(s.arrays["pooled"], feat(cfg.d_model), title="pooled vector", x_title="feature",
                              y_title="value", y_domain=None))
arrow(13, z)
logits = z.arrays["logits"]                    # (classes,): this example's row of the cache's logits
st.dataframe(pd.DataFrame({"class": [str(c) for c in range(cfg.n_classes)], "logit": logits}), hide_index=True,
             key=k("logits"))
m = st.columns(2)
m[0].metric("Predicted class", int(np.argmax(logits)))
m[1].metric("True label", int(y[example]))

# 2. head ablation ------------------------------------------------------------------------------
st.header("2. Remove a head: what does the accuracy depend on?")
st.markdown(
    "Attention maps are **diagnostics, not explanations**: a map shows where a head looks, not whether the "
    "classifier uses what the head reads. To find out, remove the head: replace its output, before W_O, by "
    "zero or by its mean over the test set, and score the test set again.")
st.latex(r"o_h \leftarrow 0 \quad\text{or}\quad o_h \leftarrow \mathbb{E}_{\text{test set}}[o_h]"
         r"\ \text{(per position)}, \qquad \mathrm{MHA}(x) = [o_1, \dots, o_H]\, W_O + b_O")
report, reported = head_report(key, model)
ran.merge(reported)
st.radio("Remove by", inside.ABLATION_MODES, key=k("mode"), horizontal=True,
         format_func={"zero": "zero", "mean": "mean over the test set"}.get)
mode = ss[k("mode")]
labels = [names.head(i, h) for i in range(L) for h in range(cfg.n_heads)]
change = report.change(mode).ravel()
focus = report.focus.ravel()
with recording(ran):
    focused = inside.most_focused(report)
table = pd.DataFrame({"head": labels, "focus of its mean map": focus})
if unlocked:
    table["test accuracy without it"] = report.accuracy[mode].ravel()
    table["change"] = change
heads_are = f"this model's heads are L1H1 to {labels[-1]} ({L} layers of {cfg.n_heads} heads)"
if ss[k("show")] not in labels:
    state.settle(PAGE, "show", labels[focused], f"{heads_are}; the most focused one is shown.")
st.metric("Test accuracy, every head in place", f"{report.baseline:.3f}")
a, b = st.columns([3, 2])
with a:
    st.dataframe(table, hide_index=True, key=k("ablation_table"))
    if unlocked:
        bar_chart(charts.bar(change, labels, title=f"Change in test accuracy with one head removed ({mode})",
                             x_title="head removed", y_title="change in accuracy", y_domain=None))
with b:
    st.selectbox("Head whose map is shown", labels, key=k("show"),
                 help="Papers count layers and heads from 0: " + ", ".join(
                     f"{names.head(i, h)} is {names.paper_head(i, h)}" for i in range(L) for h in range(cfg.n_heads)))
    shown = labels.index(ss[k("show")])
    i, h = divmod(shown, cfg.n_heads)
    st.vega_lite_chart(charts.heatmap(report.mean_maps[i, h], feat(T), feat(T), annotate=False, size=260,
                                      title=f"{ss[k('show')]}: mean map over the test set"))
    if unlocked:
        st.metric(f"Removing {ss[k('show')]} changes the test accuracy by", f"{change[shown]:+.3f}")
focus_words = (f"Focus = 1 − (mean row entropy of the head's test-set mean map) / log₂T: 0 for a uniform map, 1 when "
               f"every query looks at one key. The most focused head here is {labels[focused]} (focus "
               f"{focus[focused]:.3f})")
if not unlocked:
    st.caption(focus_words + ". Answer the question at the top of the page to see what removing each head does.")
else:
    with recording(ran):
        drop = inside.largest_drop(change)
        outcome = inside.focused_head_outcome(report, mode)
    said = f"; removing it changes the accuracy by {change[focused]:+.3f}"
    if drop is None:
        said += ", and removing no single head lowers the accuracy."
    elif outcome == inside.FALLS_MOST:
        said += ", the largest drop of any single head."
    else:
        said += f", while the largest drop comes from removing {labels[drop]} ({change[drop]:+.3f})."
    st.caption(focus_words + said)

asked = [t for t in ss[k("remove")].split(",") if t]
if any(t not in labels for t in asked):
    state.settle(PAGE, "remove", ",".join(t for t in asked if t in labels),
                 f"{heads_are}, so {', '.join(t for t in asked if t not in labels)} cannot be removed.")
ss[k("remove_heads")] = [x for x in ss.get(k("remove_heads"), [t for t in ss[k("remove")].split(",") if t])
                         if x in labels]
st.multiselect("Remove several heads at once", labels, key=k("remove_heads"), disabled=not unlocked)
removed = ss[k("remove_heads")]
ss[k("remove")] = ",".join(removed)
if unlocked:
    heads = tuple(divmod(labels.index(x), cfg.n_heads) for x in removed)
    acc, removed_ran = several_removed(key, heads, mode, model, report.head_means)
    ran.merge(removed_ran)
    st.metric(f"Test accuracy with {len(removed)} head(s) removed ({mode})", f"{acc:.3f}",
              delta=f"{acc - report.baseline:+.3f}" if removed else None,     # no change to show with none removed
              delta_color="normal" if removed else "off")

st.subheader("Layer-1 attention, averaged over the heads, for two test sequences")
pair = [0, min(5, n_test - 1)]
with recording(ran):
    _, pair_cache = inside.forward(model.params, cfg, X[pair])
    averaged = [inside.head_averaged_attention(pair_cache, 0, j) for j in range(2)]
    spread = [float(row_entropy_bits(w).mean() / np.log2(T)) if T > 1 else 1.0 for w in averaged]
titles = []
for name, idx in zip(("Example A", "Example B"), pair):
    extra = f"sum={int(X[idx].sum())}, " if data.task == "sum" else ""
    titles.append(f"{name} (test #{idx}): {extra}label={int(y[idx])}")
grid = charts.heatmap_grid(averaged, feat(T), feat(T), titles, columns=2, size=260, annotate=False,
                           panel_title="example")
grid["spec"]["layer"][0]["encoding"]["color"]["scale"] = {"scheme": charts.SEQUENTIAL, "domain": [0.0, 2.5 / T],
                                                          "clamp": True}
st.vega_lite_chart(grid)
st.caption(f"The colour scale ends at 2.5/T = {2.5 / T:.3f} (weights above it share its colour), so a near-uniform "
           f"map (every weight about 1/T = {1 / T:.3f}) still shows its structure. Measured: a row of these maps "
           f"keeps on average {spread[0]:.0%} (A) and {spread[1]:.0%} (B) of the entropy of a uniform row (log₂T bits)"
           + ("; on 'sum' the label depends on every token alike." if data.task == "sum" else "."))

st.subheader("Pooling: the mean over positions, or one position alone ([CLS]-style)")
(mean_acc, single), pooled = pooling(key, model)
ran.merge(pooled)
st.markdown(
    "This encoder has no [CLS] token: like the lesson's model it classifies the **mean** of its last layer's "
    "vectors x_t. A [CLS] model instead reads the last layer's vector at one position. Here the trained classifier "
    "reads each single position in place of the mean, without retraining: how much of the sequence's "
    "information has each position gathered through attention? (A model trained with [CLS] pooling would "
    "learn to gather it there; this measures the mean-pooled model only.)")
pool_table = pd.DataFrame({
    "pooling": ["mean over positions (as trained)", "position 1 only ([CLS]-style)",
                f"best single position ({int(np.argmax(single)) + 1})",
                f"worst single position ({int(np.argmin(single)) + 1})"],
    "test accuracy": [mean_acc, single[0], single.max(), single.min()]})
a, b = st.columns(2)
with a:
    st.dataframe(pool_table, hide_index=True, key=k("pooling_table"))
with b:
    bar_chart(charts.bar(single, feat(T), title="Test accuracy reading one position", x_title="position",
                                  y_title="test accuracy"))

if sources := widgets.source_expander("Source of these numbers"):
    with sources:
        st.markdown("The encoder run as the one transformer (`core/model/transformer.py`): its readable forward "
                    "pass, which keeps every array it computes in the cache; then the lesson's selections and "
                    "summaries of that cache (`core/lessons/inside.py`).")
        widgets.function_sources(ran)

state.publish(PAGE, SPEC)
