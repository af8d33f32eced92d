"""Train a tiny transformer encoder live, watch its heads form, and compare ablations."""
import functools

import pandas as pd
import streamlit as st

from core import limits, warmup
from core.training import steps, tasks, encoder_runs
from core.model.config import EMBEDDING_POSITIONAL as POSITIONAL   # the encoder adds its positions
from core.lessons.questions import training as questions
from ui import charts, lesson, state
from core.training.encoder_runs import EncoderRun
from core.model.upload import weights_from_upload
from ui.step_source import STILL_COMPILING, step_record_of
from ui.trainer import Trainer
from ui.widgets import act, function_sources, live_view, run_progress, source_expander


PAGE = "training"
SPEC = {
    "task": state.choice_field("sum", tuple(tasks.TASKS)),
    "layers": state.int_field(2, 1, limits.MAX_TRAIN_LAYERS),
    "heads": state.int_field(4, 1, limits.MAX_TRAIN_HEADS),
    "d_model": state.int_field(32, 1, limits.MAX_TRAIN_D_MODEL),
    "positional": state.choice_field("sinusoidal", POSITIONAL),
    "lr": state.choice_field("0.003", ("0.0003", "0.001", "0.003", "0.01", "0.03")),
    "steps": state.int_field(300, 1, limits.MAX_TRAIN_STEPS),
    "ablation_steps": state.int_field(1000, 1, limits.MAX_TRAIN_STEPS),
    "track": state.choice_field(steps.DEFAULT_TRACK, steps.TRACKS),
    "example": state.int_field(0, 0, 100_000),       # the validation example whose maps are shown
}
k = lambda name: state.key(PAGE, name)  # noqa: E731
# test hooks: tests put tiny data-set sizes and a faster poll here
SIZES_KEY, POLL_KEY = k("data_sizes"), k("poll_seconds")
UPLOAD_BYTES_KEY = k("upload_bytes")     # raw bytes treated like an uploaded file (tests)
UPLOAD_NOTE_KEY = k("upload_note")
TRAINER_KEY, ABLATION_KEY = k("trainer"), k("ablation_trainer")

for name in (TRAINER_KEY, ABLATION_KEY):      # a test may put in its own, with tiny caps
    if name not in st.session_state:
        st.session_state[name] = Trainer()
trainer: Trainer = st.session_state[TRAINER_KEY]
ablation: Trainer = st.session_state[ABLATION_KEY]
n_train, n_val, n_test = st.session_state.get(SIZES_KEY, (4000, 1000, 1000))
poll = float(st.session_state.get(POLL_KEY, 0.5))

st.title("Train a tiny encoder")
state.restore(PAGE, SPEC)
lesson.header("training")
unlocked = lesson.predict("training")  # opens the ablation runs (section 3)
st.markdown(
    "A transformer encoder small enough to train here in seconds: token embeddings plus positions, a few "
    "layers of multi-head attention and a feed-forward net, then a two-class classifier. Besides attention, "
    "five pieces arrive on this page; the next page, **Inside a trained model**, takes the first four apart "
    "on a trained model:\n"
    "- **Residual connection**: each sublayer's output is added to its input, x + MHA(x), so the sublayer "
    "learns a change to x rather than a replacement for it.\n"
    "- **LayerNorm**: after each residual sum, every token's vector is shifted and scaled to mean 0 and "
    "standard deviation (just under) 1 across its d_model features, then given a learned gain and bias per "
    "feature, so the scale of each layer's input is set by those, whatever the layers before it computed.\n"
    "- **Feed-forward net (FFN)**: two dense layers with a ReLU between them (d_model → 2·d_model → d_model), "
    "applied to each position on its own.\n"
    "- **Mean pooling**: the classifier reads one vector per sequence, the mean of the last layer's vectors "
    "over the T positions.\n"
    "- **Adam**: after each batch of 64 sequences, every parameter moves against a running average of its "
    "gradient, divided by the square root of a running average of the gradient's square, so its step is set "
    "by the learning rate rather than by the gradient's scale; its code closes the **Source** expander at the "
    "bottom of this page.\n\n"
    "Forward pass, backward pass and Adam are our own NumPy + Numba code.")

with st.expander("The architecture, in equations", expanded=False):
    st.latex(r"x^{(0)}_t = E[\mathrm{tok}_t] + PE_t \qquad (E \in \mathbb{R}^{V \times d_{\text{model}}},\; "
             r"PE \text{ sinusoidal, learned, or } 0)")
    st.latex(r"\tilde x = \mathrm{LN}_1\!\big(x + \mathrm{MHA}(x)\big), \qquad "
             r"\mathrm{MHA}(x) = [o_1, \dots, o_H]\, W_O + b_O")
    st.latex(r"o_h = \mathrm{softmax}\!\left(\frac{Q_h K_h^\top}{\sqrt{d_k}}\right) V_h, "
             r"\quad Q_h = x W_Q^h + b_Q^h,\; d_k = d_{\text{model}} / H")
    st.latex(r"x^{(\ell)} = \mathrm{LN}_2\!\big(\tilde x + \max(0, \tilde x W_1 + b_1)\, W_2 + b_2\big)")
    st.latex(r"\bar x = \frac{1}{T} \sum_{t=1}^{T} x^{(L)}_t, \qquad z = \bar x\, W_{\text{cls}} + b_{\text{cls}}")
    st.latex(r"\mathcal{L} = -\frac{1}{B} \sum_{b=1}^{B} \log \frac{e^{z_{b, y_b}}}{\sum_c e^{z_{b,c}}}")
    st.caption("x is the residual stream, one row per token: x^(ℓ) after layer ℓ of L, x^(0) the embeddings. "
               "Post-norm: the layer norm comes after each residual sum, as in the original Transformer.")

with st.expander("What to look for"):
    st.markdown(
        "- **sum** does not care where the tokens sit: its label depends on the tokens alone, so positions "
        "cannot help it. Its attention maps tend to stay broad, since every token matters equally.\n"
        "- **increasing** is a near-miss task: a negative holds the same tokens as a positive, with one "
        "neighbouring pair swapped"
        + (". Without positional encoding the model cannot see order at all (the question at the top, and "
           "section 3, show why)" if unlocked else "") +
        ". It takes more steps than sum (the ablations below run 1000); with positions, watch for heads whose "
        "weight moves next to the diagonal (a token looking at its neighbour).\n"
        "- **repeat** asks whether a token equals the one before it: a head that looks one position back "
        "can answer that.\n"
        "- The loss can sit on a plateau before it falls; validation accuracy is measured every 25 steps on "
        "sequences the model never trains on.\n"
        "- Attention maps are diagnostics, not explanations: a pattern that looks meaningful may not be "
        "what the classifier relies on. **Inside a trained model** removes heads one at a time to measure it.")

# 1. settings -------------------------------------------------------------------------------------
st.header("1. Settings")
left, mid, right = st.columns(3)
left.selectbox("Task", tuple(tasks.TASKS), key=k("task"))
task = st.session_state[k("task")]
left.caption(tasks.describe(task))
left.radio("Positional encoding", POSITIONAL, key=k("positional"), horizontal=True)
mid.slider(f"Layers (at most {limits.MAX_TRAIN_LAYERS})", 1, limits.MAX_TRAIN_LAYERS, key=k("layers"))
state.whole_number_input(mid, f"Heads H (at most {limits.MAX_TRAIN_HEADS})", 1, limits.MAX_TRAIN_HEADS,
                         key=k("heads"))
state.whole_number_input(mid, f"d_model (at most {limits.MAX_TRAIN_D_MODEL}; H must divide it)", 1,
                         limits.MAX_TRAIN_D_MODEL, key=k("d_model"))
right.select_slider("Learning rate (Adam; falls to a tenth by the last step)",
                    SPEC["lr"].choices, key=k("lr"))
state.whole_number_input(right, f"Steps (at most {limits.MAX_TRAIN_STEPS})", 1, limits.MAX_TRAIN_STEPS, key=k("steps"))
right.caption(f"Caps per run: {limits.MAX_TRAIN_STEPS} steps and {limits.MAX_TRAIN_SECONDS:.0f} s of "
              "training, whichever comes first, so one run cannot hold the server.")
left.radio("Training step", steps.TRACKS, key=k("track"), horizontal=True,
           help="readable: the transformer's forward pass and its backward pass written by hand, sublayer "
                "by sublayer in NumPy (the code under **Source** below). compiled: the same step as one "
                "call into Numba, several times faster. Tests hold the two to the same numbers.")
track = st.session_state[k("track")]

spec = EncoderRun(task=task, n_layers=int(st.session_state[k("layers")]), n_heads=int(st.session_state[k("heads")]),
               d_model=int(st.session_state[k("d_model")]), positional=st.session_state[k("positional")],
               lr=float(st.session_state[k("lr")]), steps=int(st.session_state[k("steps")]),
               n_train=n_train, n_val=n_val, n_test=n_test, label="run")
try:
    spec.check()
    spec.config()
    spec_problem = None
except ValueError as err:
    spec_problem = str(err)
    st.error(spec_problem)


# 2. controls -------------------------------------------------------------------------------------
st.header("2. Train")
lesson.ask(questions.FIRST_LOSS)
busy_elsewhere = ablation.running
b1, b2, b3, b4 = st.columns(4)
if b1.button("Start training", type="primary", disabled=spec_problem is not None or trainer.running):
    if busy_elsewhere:
        st.warning("The ablation runs are training: stop them first (one job per session).")
    else:
        # the compiled step is the readable one until a freshly started server has compiled it
        run_track = warmup.track(warmup.ENCODER) if track == "compiled" else track
        if run_track != track:
            st.info("This server has just started and still compiles the compiled step in the background: this "
                    "run trains on the readable step (the ms-per-step metric names the step that ran).")
        act(functools.partial(trainer.start, train=functools.partial(encoder_runs.train, track=run_track)), spec)
if b2.button("Pause", disabled=not trainer.running):
    act(trainer.pause)
if b3.button("Resume", disabled=trainer.status not in ("paused", "loaded") or busy_elsewhere):
    act(trainer.resume)
if b4.button("Reset"):
    act(trainer.reset)

view = trainer.view()
if view.runs:
    if st.session_state[k("example")] > max(n_val - 1, 0):
        state.settle(PAGE, "example", max(n_val - 1, 0), f"the validation set has {n_val} examples, 0 to {n_val - 1}.")
    example = state.whole_number_input(st, f"Validation example whose attention is shown (0 to {n_val - 1})",
                                       0, max(n_val - 1, 0), key=k("example"))
    if int(example) != view.example_index:
        trainer.set_example(int(example))


def accuracy_frame(runs, kind: str = "val") -> pd.DataFrame:
    """Long-form accuracy points: validation where evaluated, or also the training batch (thinned).

    One run: curves named "validation" / "training batch"; several: named after their runs.
    """
    rows = []
    for run in runs:
        train_name, val_name = ("training batch", "validation") if len(runs) == 1 else (run.label, run.label)
        stride = max(1, len(run.metrics) // 400)
        for i, m in enumerate(run.metrics):
            if kind == "train" and i % stride == 0:
                rows.append({"step": m["step"], "accuracy": m["train_acc"], "curve": train_name})
            if m["evaluated"] and m["val_acc"] is not None:
                rows.append({"step": m["step"], "accuracy": m["val_acc"], "curve": val_name})
    return pd.DataFrame(rows, columns=["step", "accuracy", "curve"])


def legend_below(spec: dict) -> dict:
    """Put a line chart's legend under it, so two charts side by side keep their width."""
    spec["encoding"]["color"]["legend"] = {"orient": "bottom", "title": None}
    return spec


def loss_frame(runs, points: int = 400) -> pd.DataFrame:
    """Long-form loss, thinned to about ``points`` per run so a redraw stays cheap."""
    rows = []
    for run in runs:
        stride = max(1, len(run.metrics) // points)
        rows += [{"step": m["step"], "loss": m["loss"], "run": run.label} for m in run.metrics[::stride]]
    return pd.DataFrame(rows, columns=["step", "loss", "run"])


def show_attention(run, example_index: int) -> None:
    if run.attention is None:
        return
    L, H, T, _ = run.attention.shape
    pos = [f"{t + 1}:{tok}" for t, tok in enumerate(run.example_tokens[:T])]
    st.markdown(f"**Attention of every layer and head** on validation example {example_index} "
                f"(tokens `{' '.join(map(str, run.example_tokens))}`, label {run.example_label}), "
                f"snapshot at step {run.attention_step}.")
    titles = [f"layer {l + 1}, head {h + 1}" for l in range(L) for h in range(H)]
    mats = [run.attention[l, h] for l in range(L) for h in range(H)]
    # the dict builder: Altair's objects cost most of a second per redraw at 8 panels of 16 x 16
    st.vega_lite_chart(charts.heatmap_grid(mats, pos, pos, titles, columns=min(H, 4), size=150, annotate=False))


def draw_live() -> None:
    """Everything that changes while the worker trains."""
    current = trainer.view()
    if not current.runs:
        st.info("Choose the settings and press **Start training**. The curves and attention maps "
                "below grow while it trains.")
        return
    run = current.runs[0]
    last = run.last
    run_progress(current, run.step, run.target_steps)
    c = st.columns(4)
    c[0].metric("Loss (last batch)", f"{last['loss']:.4f}" if last else "–")
    val = run.final_val_acc
    c[1].metric("Validation accuracy", f"{val:.3f}" if val is not None else "–")
    timed = last is not None and last["ms_per_step"] is not None
    c[2].metric(f"ms per step ({last['track']} step)" if timed else "ms per step",
                f"{last['ms_per_step']:.2f}" if timed else "–",
                help="Training time per step (forward, backward, Adam), evaluations excluded.")
    c[3].metric("Seconds", f"{last['elapsed']:.1f}" if last else "–")
    if run.metrics:
        a, b = st.columns(2)
        a.vega_lite_chart(charts.lines(loss_frame([run]), "step", "loss", title="Loss (cross-entropy of each batch)"),
                          width="stretch")
        b.vega_lite_chart(legend_below(charts.lines(accuracy_frame([run], "train"), "step", "accuracy", "curve",
                                                    title="Accuracy", y_domain=(0.0, 1.0))), width="stretch")
    show_attention(run, current.example_index)


live_view(draw_live, "the training view", lambda: trainer.running, poll)

# results, download and upload (part of section 2: they appear once a run has ended) ----------------
view = trainer.view()
if view.runs and not view.running:
    run = view.runs[0]
    st.subheader("Results")
    if run.test_acc is not None:
        st.metric(f"Test accuracy ({n_test} sequences never seen in training)", f"{run.test_acc:.3f}")
        table = pd.DataFrame(run.confusion, index=["true 0", "true 1"], columns=["predicted 0", "predicted 1"])
        st.markdown("**Confusion table** (rows: the true class; columns: the model's answer)")
        st.table(table)
    if run.stop_reason:
        st.caption(f"The run {run.stop_reason}.")
    try:
        st.download_button("Download the weights (.npz)", trainer.weights_npz(),
                           file_name=f"encoder_{run.spec.task}_{run.step}steps.npz",
                           mime="application/octet-stream")
        st.caption("One array per parameter, named as in the design note (`embed`, `blocks.0.attn.W_Q`, ..., "
                   "`classifier.W`), plus the head count and the positional encoding (`config.n_heads`, "
                   "`config.positional`), so an upload rebuilds exactly this model.")
    except ValueError as err:
        st.error(str(err))

st.subheader("Load trained weights")
uploaded = st.file_uploader(f"Upload an .npz weights file (at most {limits.MAX_UPLOAD_MB} MB)", type=["npz"],
                            key=k("upload"), max_upload_size=limits.MAX_UPLOAD_MB)
raw, name = st.session_state.pop(UPLOAD_BYTES_KEY, None), "test upload"
if uploaded is not None and st.session_state.get(k("upload_seen")) != uploaded.file_id:
    st.session_state[k("upload_seen")] = uploaded.file_id
    raw, name = uploaded.getvalue(), uploaded.name
if raw is not None:
    if trainer.running:
        st.error("A run is training: pause or reset it before loading weights.")
    else:
        try:
            params, cfg, notes = weights_from_upload(raw, n_heads=spec.n_heads, positional=spec.positional)
            trainer.load(params, cfg, EncoderRun(task=task, steps=spec.steps, lr=spec.lr, n_train=n_train,
                                              n_val=n_val, n_test=n_test, label="uploaded"))
        except ValueError as err:
            st.error(f"{name}: {err} Nothing was changed.")
        except Exception as err:   # a file we did not foresee: still a message, never a traceback
            st.error(f"{name}: could not read it as encoder weights ({type(err).__name__}: {err}). "
                     "Nothing was changed.")
        else:   # redraw the whole page with the loaded model; say what happened after the rerun
            st.session_state[UPLOAD_NOTE_KEY] = (
                f"Loaded {name}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, "
                f"{cfg.positional} positions; evaluated on the '{task}' task.", notes)
            st.rerun()
if UPLOAD_NOTE_KEY in st.session_state:
    message, notes = st.session_state.pop(UPLOAD_NOTE_KEY)
    st.success(message)
    for note in notes:
        st.caption(note)

# 3. ablations ------------------------------------------------------------------------------------
st.header("3. Ablations, side by side")
st.markdown(
    "Three runs of the default model (2 layers, d_model 32) on the order-sensitive **increasing** task: "
    "with sinusoidal positions and 4 heads, the same without positional encoding, and the same with "
    "1 head. The first is the reference for both comparisons. The runs take turns, 25 steps each, and "
    f"share {limits.MAX_TRAIN_SECONDS:.0f} s of training: if that cap ends them, it ends them all at the same "
    "step, so each comparison stays between equally trained models.")
state.whole_number_input(st, f"Steps per ablation run (at most {limits.MAX_TRAIN_STEPS})", 1,
                         limits.MAX_TRAIN_STEPS, key=k("ablation_steps"))
abl_steps = int(st.session_state[k("ablation_steps")])
sizes = dict(n_train=n_train, n_val=n_val, n_test=n_test, steps=abl_steps, task="increasing")
ABLATIONS = [EncoderRun(label="PE, 4 heads", **sizes),
             EncoderRun(label="no PE, 4 heads", positional="none", **sizes),
             EncoderRun(label="PE, 1 head", n_heads=1, **sizes)]
a1, a2 = st.columns(2)
if a1.button("Run the ablations", disabled=ablation.running or not unlocked):
    if trainer.running:
        st.warning("The main run is training: pause or reset it first (one job per session).")
    else:
        act(ablation.start, ABLATIONS)
if a2.button("Stop the ablations"):
    act(ablation.reset)


def steps_done(run) -> str:
    """A run's step count, flagged beside the number when a time cap stopped it early."""
    if run.finished and run.step < run.target_steps:
        return f"{run.step} of {run.target_steps} (stopped early: time cap)"
    return f"{run.step} of {run.target_steps}"


def draw_ablations() -> None:
    """The ablation runs' progress, curves and final accuracies."""
    current = ablation.view()
    if not current.runs:
        st.caption("Not run yet.")
        return
    finished = sum(r.finished for r in current.runs)
    total = sum(r.target_steps for r in current.runs)
    # full once every run has ended, at its steps or at the cap
    done = total if finished == len(current.runs) else sum(r.step for r in current.runs)
    run_progress(current, done, total, f"{finished} of {len(current.runs)} runs finished")
    pe, no_pe, one_head = current.runs
    left, right = st.columns(2)
    for col, runs, title in ((left, [pe, no_pe], "Positional encoding: with vs without"),
                             (right, [pe, one_head], "Heads: 4 vs 1")):
        with col:
            st.markdown(f"**{title}**")
            frame = accuracy_frame(runs)
            if len(frame):
                st.vega_lite_chart(legend_below(charts.lines(frame, "step", "accuracy", "curve",
                                                             title="Validation accuracy", y_domain=(0.0, 1.0))),
                                   width="stretch")
            st.table(pd.DataFrame({
                "run": [r.label for r in runs],
                "steps": [steps_done(r) for r in runs],
                "validation accuracy": [("–" if r.final_val_acc is None else f"{r.final_val_acc:.3f}") for r in runs],
                "test accuracy": [("–" if r.test_acc is None else f"{r.test_acc:.3f}") for r in runs],
            }))
    early = [r for r in current.runs if r.finished and r.step < r.target_steps]
    if early:
        st.warning(f"The time cap stopped the runs at step {early[0].step} of {early[0].target_steps}: they are "
                   "compared after equal training, but not after the steps asked for.")


live_view(draw_ablations, "the ablations", lambda: ablation.running, poll)


def step_source(run_spec: EncoderRun | None, track_ran: str) -> None:
    """The functions one training step of the run's model runs on the track that ran (else of the
    model and track chosen), as one step records them."""
    if sources := source_expander(f"Source: the {track_ran} training step"):
        with sources:
            st.caption("Each function of one step (forward, loss, backward, Adam), in the order it first runs. "
                       + ("The forward and backward passes are the one transformer's, shared with the other pages."
                          if track_ran == "readable" else
                          "One call into Numba runs all of it; the readable step computes the same numbers."))
            step = None if run_spec is None else step_record_of("encoder", run_spec.config(), track_ran)
            if run_spec is None:
                st.caption("Choose settings the model can be built with to see its step.")
            elif step is None:
                st.caption(STILL_COMPILING)
            else:
                function_sources(step)


ran = trainer.view()
last_step = ran.runs[0].last if ran.runs else None
if last_step and last_step["track"]:
    step_source(ran.runs[0].spec, last_step["track"])
else:
    step_source(None if spec_problem else spec, track)

state.publish(PAGE, SPEC)
