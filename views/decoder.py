"""Decoder and generation: train a small decoder live, see teacher forcing, then generate one token
at a time through the KV cache and watch the attention rows, the cache and the sampler."""
import functools
import time

import numpy as np
import pandas as pd
import streamlit as st

from core import limits
from core.lessons import kv_cache
from core.lessons.questions import decoder as questions
from core.model import decoder, layers, names, sampling, transformer_encdec
from core.recording import Record, recorded, recording
from core.training import steps, tasks
from core.model import generation as decoding  # the page has a function named generation
from core.training.decoder_runs import DEFAULTS, build
from ui import charts, lesson, state
from ui.step_source import STILL_COMPILING, step_record_of
from ui.widgets import act, chosen_dtype, function_sources, live_view, run_progress, source_expander
from ui.decoder_trainer import EVAL_EVERY, TASKS, DecoderTrainer


PAGE = "decoder"
SPEC = {
    "task": state.choice_field("reverse", tuple(TASKS)),
    "steps": state.int_field(DEFAULTS["reverse"].steps, 1, limits.MAX_TRAIN_STEPS),
    "example": state.int_field(0, 0, 10_000),
    "prompt": state.text_field(kv_cache.LM_PROMPT),
    "temperature": state.float_field(1.0, 0.0, 100.0),
    "top_k": state.text_field(""),
    "top_p": state.float_field(1.0, 0.0, 1.0),
    "seed": state.int_field(0, 0, 1_000_000),
    "step": state.int_field(1, 1, 64),
    "layer": state.int_field(1, 1, limits.MAX_TRAIN_LAYERS),
    "head": state.int_field(1, 1, limits.MAX_TRAIN_HEADS),
    "track": state.choice_field(steps.DEFAULT_TRACK, steps.TRACKS),
    "compare": state.bool_field(False),
}
k = lambda name: state.key(PAGE, name)  # noqa: E731
TRAINER_KEY, POLL_KEY = k("trainer"), k("poll_seconds")      # tests put a faster poll here
GOOD_KEY, MEMO_KEY, CAST_KEY = k("good_inputs"), k("memo"), k("weights_in_precision")
TIMING_REPEATS = 5          # generation timings: one untimed call to warm up, then the best of this many

if TRAINER_KEY not in st.session_state:
    st.session_state[TRAINER_KEY] = DecoderTrainer()
trainer: DecoderTrainer = st.session_state[TRAINER_KEY]
poll = float(st.session_state.get(POLL_KEY, 0.5))


@st.cache_resource(show_spinner="Building the data set…")
def setup_of(task: str):
    """The task's model configuration, data and default settings (shared, read-only)."""
    return build(task)


def spec_for(task: str) -> dict:
    """The page's fields with this task's own default step count (a link leaves it out when equal)."""
    return dict(SPEC, steps=state.int_field(setup_of(task).defaults.steps, 1, limits.MAX_TRAIN_STEPS))


st.title("Decoder and generation")
first_run = state.first_run(PAGE)
state.restore(PAGE, SPEC)
lesson.header("decoder")
unlocked = lesson.predict("decoder")  # opens the comparison with a full recompute (section 4)
st.markdown(
    "A decoder writes its output one token at a time, each token conditioned on the ones before it. "
    "Here it runs as an **encoder-decoder** that reverses or sorts a string of 8 digits (cross-attention "
    "reads the encoder's output), or as a **decoder-only** character language model. Forward pass, "
    "backward pass, Adam, the KV cache and the sampler are our own NumPy + Numba code.")

with st.expander("The decoder layer, in equations"):
    st.latex(r"x \leftarrow \mathrm{LN}_1\big(x + \mathrm{MHA}(x, x;\ M_{\text{causal}})\big)"
             r"\quad\text{(masked self-attention)}")
    st.latex(r"x \leftarrow \mathrm{LN}_{\times}\big(x + \mathrm{MHA}(x, m)\big)"
             r"\quad\text{(cross-attention: queries from } x\text{, keys and values from the encoder's } m)")
    st.latex(r"x \leftarrow \mathrm{LN}_2\big(x + \max(0, xW_1 + b_1)W_2 + b_2\big), \qquad "
             r"p(y_t \mid y_{<t}, \text{src}) = \mathrm{softmax}(x_t W_{\text{out}} + b_{\text{out}})")
    st.caption("The decoder-only model has no encoder and no cross-attention sublayer.")


def task_changed() -> None:
    """A new task starts from its own default step count."""
    st.session_state[k("steps")] = setup_of(st.session_state[k("task")]).defaults.steps


if first_run and "steps" not in st.query_params:   # a link that names only the task: that task's default
    task_changed()

# 1. train ----------------------------------------------------------------------------------------
st.header("1. Train")
left, right = st.columns(2)
left.selectbox("Model and task", tuple(TASKS), format_func=TASKS.get, key=k("task"), on_change=task_changed)
task = st.session_state[k("task")]
setup = setup_of(task)
cfg = setup.cfg
stack = transformer_encdec.target_stack(cfg)    # the stack that reads the target (the model itself, decoder-only)
left.caption(tasks.SEQUENCE_TASKS[task].description if setup.seq2seq else
             f"Predict the next character of a small English corpus ({stack.vocab_size} characters, "
             f"context {stack.n_ctx}).")
state.whole_number_input(right, f"Steps (at most {limits.MAX_TRAIN_STEPS}; this task's default is "
                         f"{setup.defaults.steps})", 1, limits.MAX_TRAIN_STEPS, key=k("steps"))
right.caption(f"{stack.n_layers} layers, d_model {stack.d_model}, {stack.n_heads} heads, "
              f"{decoder.param_count(cfg):,} parameters; Adam, batch {setup.defaults.batch_size}, learning rate "
              f"{setup.defaults.lr:g} with {setup.defaults.warmup} warm-up steps and a cosine decay. A run stops after "
              f"{limits.MAX_TRAIN_SECONDS:.0f} s of training at most.")
left.radio("Training step", steps.TRACKS, key=k("track"), horizontal=True,
           help="readable: the one transformer's forward pass and its backward pass written by hand, in NumPy "
                "(the code under **Source** below). compiled: the same step as one call into Numba, several "
                "times faster. Tests hold the two to the same numbers.")
b1, b2, b3 = st.columns(3)
if b1.button("Train", type="primary", disabled=trainer.running):
    act(functools.partial(trainer.start, track=st.session_state[k("track")]), setup, int(st.session_state[k("steps")]))
if b2.button("Stop", disabled=not trainer.running):
    act(trainer.stop)
if b3.button("Reset"):
    act(trainer.reset)

def draw_live() -> None:
    """The run's progress and curves."""
    view = trainer.view()
    if not view.metrics and not view.running:
        st.info("Press **Train**: the loss and validation curves grow here while it trains.")
        return
    if view.task and view.task != task:
        st.caption(f"The last run trained the task '{view.task}'.")
    run_progress(view, view.step, view.target_steps)
    if view.status not in ("error", "queued", "compiling") and view.message:
        st.caption(view.message)
    last = view.last
    c = st.columns(4)
    c[0].metric("Loss (last batch)", f"{last['loss']:.4f}" if last else "–")
    c[1].metric(f"Validation {view.metric}", f"{view.final_eval:.3f}" if view.final_eval is not None else "–")
    c[2].metric(f"ms per step ({view.track} step)", f"{last['ms_per_step']:.2f}" if last else "–",
                help="Training time per step (forward, backward, Adam), validation excluded.")
    c[3].metric("Seconds", f"{last['elapsed']:.1f}" if last else "–")
    if view.metrics:
        stride = max(1, len(view.metrics) // 400)       # thinned: a redraw stays cheap
        loss = pd.DataFrame(view.metrics[::stride])
        a, b = st.columns(2)
        a.vega_lite_chart(charts.lines(loss, "step", "loss", title="Loss (cross-entropy of each batch)"),
                          width="stretch")
        evals = pd.DataFrame(view.evals, columns=["step", "value"])
        b.vega_lite_chart(charts.lines(evals, "step", "value", title=f"Validation {view.metric}",
                                       y_title=view.metric, y_domain=(0.0, 1.0), points=True), width="stretch")
        b.caption(f"Measured on the validation set with the weights the run starts from, every {EVAL_EVERY} "
                  "steps while it trains, and with the weights it ends with.")


live_view(draw_live, "the training view", lambda: trainer.running, poll)
trained_params, model_version, trained = trainer.model(setup)
dtype = np.dtype(chosen_dtype())


def in_precision(weights: dict) -> dict:
    """The model's weights in the sidebar's precision (training itself runs in float32), converted
    once per model and precision in this session (versions are this session's trainer's)."""
    key = (task, model_version if trained else -1, dtype.name)
    held = st.session_state.get(CAST_KEY)
    if held is None or held[0] != key:
        held = (key, {name: value.astype(dtype) for name, value in weights.items()})
        st.session_state[CAST_KEY] = held
    return held[1]


params = in_precision(trained_params)
if not trained:
    st.warning("The sections below use **untrained** weights (seed 0) until a run on this task ends.")
st.caption(f"Training runs in float32 (either training step). The sections below run the weights in **{dtype.name}**, "
           "the sidebar's precision" + ("." if not unlocked else ": cached and recomputed logits then agree to ~1e-15."
                                        if dtype == np.float64 else ": cached and recomputed logits then agree to ~1e-6."))


# 2. teacher forcing ------------------------------------------------------------------------------
st.header("2. Training: teacher forcing and the causal mask")
tgt_in_val, tgt_out_val, src_val = setup.val_arrays()
n_val = len(tgt_in_val)
if st.session_state[k("example")] > n_val - 1:
    state.settle(PAGE, "example", n_val - 1, f"this task has {n_val} validation examples, 0 to {n_val - 1}.")
state.whole_number_input(st, f"Validation example (0 to {n_val - 1})", 0, n_val - 1, key=k("example"))
i = int(st.session_state[k("example")])
src = None if src_val is None else src_val[i]
tgt_in, tgt_out = tgt_in_val[i], tgt_out_val[i]
ran = Record()                     # what computes the numbers below, for the source at the end of the page
with recording(ran):
    logits, fcache = recorded(decoder.forward)(params, cfg, tgt_in, src)   # (T, V)
    p_target = np.exp(recorded(layers.log_softmax)(logits.astype(np.float64)))[np.arange(len(tgt_out)), tgt_out]
prediction = logits.argmax(axis=-1)


def text_of(ids) -> list[str]:
    """Token ids as the characters they stand for, one per id."""
    return list(tasks.digits_text(ids)) if setup.seq2seq else list(setup.data.vocab.decode(ids))


def shown(chars: list[str]) -> list[str]:
    """Characters made visible in a table or an axis (a space as ␣, a newline as ⏎)."""
    return [c.replace(" ", "␣").replace("\n", "⏎") for c in chars]


st.markdown("In training, the decoder reads the **target shifted right** (starting with the start "
            "symbol `^`) and must predict the target at every position at once. The causal mask keeps "
            "position *t* from seeing positions after it, so all *T* predictions come from one forward pass.")
st.latex(r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \qquad "
         r"\mathcal{L} = -\frac{1}{T}\sum_{t=1}^{T} \log p_\theta\big(y_t \mid y_{<t}\big)")
rows = {"position": np.arange(1, len(tgt_in) + 1)}
if src is not None:
    rows["source"] = shown(text_of(src))
rows.update({"decoder input": shown(text_of(tgt_in)), "target": shown(text_of(tgt_out)),
             "prediction (argmax)": shown(text_of(prediction)),
             "p(target)": p_target,
             "right": prediction == tgt_out})
st.dataframe(pd.DataFrame(rows), hide_index=True)
st.metric("Positions predicted right (teacher forcing, this example)", f"{int((prediction == tgt_out).sum())} of {len(tgt_out)}")
st.caption("Teacher forcing: each position reads the *true* earlier tokens, not the model's own guesses. "
           "Generation, below, has no true tokens to read: it must run one position at a time and feed "
           "each new token back in.")


# 3. generation -----------------------------------------------------------------------------------
st.header("3. Generation, one token at a time")
st.markdown("Generation has no target to read: each step runs the decoder on everything written so far, "
            "turns the last position's logits into a distribution, draws one token and appends it. With "
            "the **KV cache**, the first step runs the whole prompt at once and keeps every position's keys "
            "and values; each later step runs only the new token, whose keys and values join the cache and "
            "whose query attends over every cached row.")
st.latex(r"p_i = \frac{e^{z_i/\tau}}{\sum_j e^{z_j/\tau}}\ \ (\tau = 0:\ \arg\max), \qquad "
         r"\text{top-}k:\ \text{the } k \text{ likeliest}, \qquad "
         r"\text{top-}p:\ \text{the fewest likeliest with } \textstyle\sum p_i \ge p")


def parse_top_k(text: str) -> int | None:
    """top-k as typed: a whole number from 1, or None (blank: no limit); ``ValueError`` in the user's terms."""
    raw = str(text).strip()
    if not raw:
        return None
    try:
        top_k = int(raw)
    except ValueError:
        raise ValueError(f"top-k must be a whole number >= 1, or blank for no limit; got {raw!r}.") from None
    if top_k < 1:
        raise ValueError(f"top-k must be a whole number >= 1, or blank for no limit; got {top_k}.")
    return top_k


def sampler_settings() -> sampling.SamplerSettings:
    """The sampler's settings from the widgets; ``ValueError`` in the user's terms."""
    return sampling.SamplerSettings(float(st.session_state[k("temperature")]), parse_top_k(st.session_state[k("top_k")]),
                                    float(st.session_state[k("top_p")]))


def prompt_ids(text: str) -> np.ndarray:
    """The language model's prompt as ids; ``ValueError`` for an empty, unknown or too long prompt."""
    text = str(text)
    if not text:
        raise ValueError("The prompt is empty: type at least one character.")
    if len(text) > stack.n_ctx:
        raise ValueError(f"The prompt has {len(text)} characters, longer than the model's context of "
                         f"{stack.n_ctx}.")
    return setup.data.vocab.encode(text)


state.vet(PAGE, "top_k", parse_top_k)
if not setup.seq2seq:
    state.vet(PAGE, "prompt", prompt_ids)
g1, g2, g3, g4 = st.columns(4)
state.decimal_number_input(g1, "Temperature τ (0 = greedy)", SPEC["temperature"].lo, SPEC["temperature"].hi,
                           key=k("temperature"), step=0.1)
g2.text_input("top-k (blank: no limit)", key=k("top_k"))
state.decimal_number_input(g3, "top-p (1 keeps every token)", SPEC["top_p"].lo, SPEC["top_p"].hi, key=k("top_p"),
                           step=0.05)
state.whole_number_input(g4, "Seed of the sampler", 0, 1_000_000, key=k("seed"))
if not setup.seq2seq:
    st.text_input(f"Prompt (1 to {stack.n_ctx} characters from the corpus's alphabet)", key=k("prompt"))

# a refused input keeps the last good one (per task), so the rest of the page stays as it was
good = st.session_state.setdefault(GOOD_KEY, {}).setdefault(
    task, {"settings": sampling.SamplerSettings(), "prompt": None if setup.seq2seq else setup.data.vocab.encode(kv_cache.LM_PROMPT)})
try:
    good["settings"] = sampler_settings()
except ValueError as err:
    st.error(f"{err} Keeping the last good sampler settings.")
if not setup.seq2seq:
    try:
        good["prompt"] = prompt_ids(st.session_state[k("prompt")])
    except ValueError as err:
        st.error(f"{err} Keeping the last good prompt.")
settings, prompt = good["settings"], good["prompt"]
n_new = stack.n_ctx if setup.seq2seq else min(kv_cache.LM_NEW_TOKENS, stack.n_ctx - len(prompt) + 1)
seed = int(st.session_state[k("seed")])


def generation(use_cache: bool):
    return decoding.generate(params, cfg, src, prompt=prompt, max_new_tokens=n_new, temperature=settings.temperature,
                             top_k=settings.top_k, top_p=settings.top_p, use_cache=use_cache, seed=seed)


def timed_generations() -> tuple:
    """Both generations, and each one's best wall time: warm (one untimed call each first), then
    ``TIMING_REPEATS`` calls taken in turns, so a busy moment of the server hits both alike; and
    the record of what the two warm calls ran (the timed ones run unwatched)."""
    with recording() as generated:
        gens = {True: generation(True), False: generation(False)}       # warm: compiled, caches filled
    best = {True: np.inf, False: np.inf}
    for _ in range(TIMING_REPEATS):
        for use_cache in (True, False):
            start = time.perf_counter()
            generation(use_cache)
            best[use_cache] = min(best[use_cache], time.perf_counter() - start)
    return gens[True], best[True], gens[False], best[False], generated


memo_key = (task, model_version, dtype.name, None if src is None else src.tobytes(),
            None if prompt is None else prompt.tobytes(), settings, seed, n_new)
memo = st.session_state.get(MEMO_KEY)
if memo is None or memo["key"] != memo_key:       # recompute only when an input changed
    try:
        cached, cached_s, full, full_s, generated = timed_generations()
    except ValueError as err:
        st.error(str(err))
        st.stop()
    memo = {"key": memo_key, "cached": cached, "cached_s": cached_s, "full": full, "full_s": full_s,
            "ran": generated}
    st.session_state[MEMO_KEY] = memo
gen = memo["cached"]
ran.merge(memo["ran"])
P, V = gen.prompt_len, stack.vocab_size
vocab_labels = shown(text_of(np.arange(V)))
written = shown(text_of(gen.tokens))
if src is not None:
    st.markdown(f"Source `{tasks.digits_text(src)}` → generated `{tasks.digits_text(gen.new_tokens)}` "
                f"(target `{tasks.digits_text(tgt_out)}`)")
else:
    st.markdown(f"Prompt `{''.join(written[:P])}` → generated `{''.join(written[P:])}`")


def labelled(matrix, row_labels, col_labels, corner: str) -> pd.DataFrame:
    """A matrix as a table whose first column, headed ``corner``, holds the row labels."""
    frame = pd.DataFrame(np.asarray(matrix, dtype=float), columns=list(col_labels))
    frame.insert(0, corner, list(row_labels))
    return frame


def step_by(delta: int) -> None:
    st.session_state[k("step")] = int(np.clip(st.session_state[k("step")] + delta, 1, n_new))


if st.session_state[k("step")] > n_new:
    state.settle(PAGE, "step", n_new, f"this generation has {n_new} step{'s' if n_new > 1 else ''}.")
s1, s2, s3 = st.columns([1, 1, 6])
s1.button("◀ Previous", on_click=step_by, args=(-1,), disabled=st.session_state[k("step")] <= 1)
s2.button("Next ▶", on_click=step_by, args=(1,), disabled=st.session_state[k("step")] >= n_new)
if n_new > 1:
    s3.slider("Step", 1, n_new, key=k("step"))
step = int(st.session_state[k("step")])
j = step - 1
read = written[:P + j]
picked = int(gen.tokens[P + j])
st.markdown(f"**Step {step} of {n_new}**: reads `{''.join(read)}` ({P + j} positions), writes "
            f"**`{written[P + j]}`**.")
m = st.columns(3)
m[0].metric("Rows in the K/V cache after this step", int(gen.cache_sizes[j]))
m[1].metric("Positions run through the decoder at this step", int(gen.positions_computed[j]))
m[2].metric("Probability of the token written", f"{gen.step_probs[j, picked]:.3f}")

c1, c2 = st.columns(2)
for col, name, count in ((c1, "layer", stack.n_layers), (c2, "head", stack.n_heads)):
    if st.session_state[k(name)] > count:
        state.settle(PAGE, name, count, f"this model has {count} {name}{'s' if count > 1 else ''}.")
    col.selectbox(f"{name.capitalize()} (attention rows: every head; K and V: this head)", range(1, count + 1),
                  key=k(name))
layer, head = int(st.session_state[k("layer")]) - 1, int(st.session_state[k("head")]) - 1
heads = [f"head {h + 1}" for h in range(stack.n_heads)]
key_labels = charts.position_labels(read)
self_row = gen.self_attn[j][layer]                                           # (H, P + j)
panels = [(f"Causal self-attention of the new query, layer {layer + 1}", self_row, key_labels, "self-attention")]
if gen.cross_attn is not None:
    panels.append((f"Cross-attention of the new query, layer {layer + 1}", gen.cross_attn[j, layer],
                   charts.position_labels(tasks.digits_text(src)), "cross-attention"))
cols = st.columns(len(panels))
for col, (title, matrix, labels, _) in zip(cols, panels):
    col.vega_lite_chart(charts.heatmap(matrix, heads, labels, title=title, row_title="head",
                                       col_title="key position", size=320))
rows_shown = int(gen.cache_sizes[j])
kv_rows = charts.position_labels(written[:rows_shown])
dims = [f"{c + 1}" for c in range(stack.d_k)]
kc, vc = st.columns(2)
for col, name, cache in ((kc, "K", gen.keys), (vc, "V", gen.values)):
    col.vega_lite_chart(charts.heatmap(cache[layer, head, :rows_shown], kv_rows, dims, kind="signed",
                                       value_name=name, title=f"{name} cache, layer {layer + 1}, head {head + 1}: "
                                       f"{rows_shown} rows", row_title="position", col_title="feature",
                                       size=260, annotate=False, domain_values=cache[layer, head]))
st.caption(f"At step 1 the whole prompt enters each cache at once ({P} row{'s' if P > 1 else ''}); after that one row "
           "joins per step, and earlier rows never change: a position's keys and values depend only on the tokens "
           "up to it.")

with recording(ran):
    before, _ = recorded(sampling.distribution)(gen.step_logits[j], sampling.SamplerSettings(settings.temperature))
status = np.where(np.arange(V) == picked, "picked", np.where(gen.allowed[j], "allowed", "removed"))
chart = charts.bar(before, vocab_labels, title=f"Next-token distribution at step {step} (τ = {settings.temperature:g})",
                   x_title="next token", y_title="probability")
for row, s in zip(chart["data"]["values"], status):
    row["status"] = str(s)
chart["encoding"]["color"] = {"field": "status", "type": "nominal", "title": "sampler",
                              "scale": {"domain": ["picked", "allowed", "removed"]}}
chart["encoding"]["opacity"] = {"condition": {"test": "datum.status === 'removed'", "value": 0.35}, "value": 1.0}
chart["encoding"]["tooltip"].append({"field": "status", "type": "nominal", "title": "sampler"})
st.vega_lite_chart(chart, width="stretch")
st.caption(f"Bars: softmax(z/τ) before top-k and top-p. The sampler could pick {int(gen.allowed[j].sum())} of "
           f"{V} tokens (coloured 'allowed' or 'picked'); it draws from them, renormalised.")

with st.expander("The numbers behind these charts"):
    for title, matrix, labels, corner in panels:
        st.markdown(f"**{title}**")
        st.dataframe(labelled(matrix, heads, labels, corner), hide_index=True)
    for name, cache in (("K", gen.keys), ("V", gen.values)):
        st.markdown(f"**{name} cache rows, layer {layer + 1}, head {head + 1}**")
        st.dataframe(labelled(cache[layer, head, :rows_shown], kv_rows, dims, name), hide_index=True)
    st.markdown("**Next-token distribution**")
    st.dataframe(pd.DataFrame({"token": vocab_labels, "p before top-k/top-p": before,
                               "p sampled from": gen.step_probs[j], "allowed": gen.allowed[j],
                               "picked": np.arange(V) == picked}), hide_index=True)


# 4. cache vs full recompute ---------------------------------------------------------------------
def timing_note(ms_cached: float, ms_full: float, full_positions: int, cached_positions: int) -> str:
    """What the measured times say, in words: whether the cache paid here, and why it may not."""
    note = (f"Times measured on this server just now ({n_new} tokens, the {dtype.name} weights), each the best of "
            f"{TIMING_REPEATS} warm calls; they vary with whatever else runs. The counts are exact. ")
    if ms_cached < 0.9 * ms_full:
        return note + f"Here the cache was {ms_full / ms_cached:.1f}× faster per token."
    return note + (
        f"Here the cache did not pay ({ms_cached:.3f} vs {ms_full:.3f} ms per token), although the recompute ran "
        f"{full_positions / cached_positions:.1f}× the positions: with a context this short, a step's cost is "
        "mostly the fixed cost of its calls (the same projections, attention and LayerNorms per layer either "
        "way, plus the cache's own bookkeeping), not the arithmetic on positions. The cache pays once the "
        "prefix is long.")


def work_note(cached: kv_cache.Work, full: kv_cache.Work) -> str:
    """What the counts say about how each kind of work grows with the length T."""
    return (f"The cache runs each position through the projections, FFNs and LayerNorms once: "
            f"{int(cached.positions.sum()):,} positions here against the recompute's {int(full.positions.sum()):,} "
            f"(growing as T against T²). Attention saves less: each new query still scores every cached key, so the "
            f"cache computes {int(cached.scores.sum()):,} query–key scores per head and layer against the "
            f"recompute's {int(full.scores.sum()):,} (growing as T² against T³).")


st.header("4. With the KV cache or without: fewer positions computed")
st.markdown("Both runs use the same input, settings and seed. Without the cache, every step runs the whole "
            "prefix through the decoder again: at the step that reads *t* positions, *t* positions and *t²* "
            "query–key scores per head. With it, step 1 runs the *P* prompt positions at once and every later "
            "step one new position, whose query scores the *t* keys in the cache.")
lesson.ask(questions.SCORES)
st.latex(r"\text{positions run: } \sum_{t=P}^{P+n-1} t \ \text{(recompute)} \ \text{vs} \ P + (n - 1) "
         r"\ \text{(cache)}; \qquad \text{scores: } \sum_{t=P}^{P+n-1} t^2 \ \text{vs} \ "
         r"P^2 + \sum_{t=P+1}^{P+n-1} t")
compare = st.toggle("Recompute every step as well, and compare with the cache", key=k("compare"),
                    disabled=not unlocked)
if not unlocked:
    st.caption("Answer the question at the top of the page first: the comparison unlocks once you have.")
elif compare:
    full = memo["full"]
    with recording(ran):
        diff = kv_cache.largest_logit_difference(gen, full)
        work, full_work = kv_cache.work(gen), kv_cache.work(full)
    d1, d2 = st.columns(2)
    d1.metric("Largest |logit difference|, cached vs recomputed", f"{diff:.2e}")
    d2.metric("Same tokens written", "yes" if np.array_equal(gen.tokens, full.tokens) else "no")
    ms_cached, ms_full = memo["cached_s"] / n_new * 1e3, memo["full_s"] / n_new * 1e3
    cost = pd.DataFrame({
        "generation": ["with the KV cache", "full recompute"],
        "positions computed": [f"{int(work.positions.sum()):,}", f"{int(full_work.positions.sum()):,}"],
        "query–key scores per head and layer": [f"{int(work.scores.sum()):,}", f"{int(full_work.scores.sum()):,}"],
        f"ms per token (best of {TIMING_REPEATS}, warm)": [f"{ms_cached:.3f}", f"{ms_full:.3f}"],
    }).set_index("generation")
    e1, e2 = st.columns([2, 3])
    e1.table(cost)
    e1.caption(work_note(work, full_work))
    e1.caption(timing_note(ms_cached, ms_full, int(full_work.positions.sum()), int(work.positions.sum())))
    per_step = pd.DataFrame({"step": np.tile(np.arange(1, n_new + 1), 2),
                             "positions": np.concatenate([work.positions, full_work.positions]),
                             "generation": ["with the KV cache"] * n_new + ["full recompute"] * n_new})
    e2.vega_lite_chart(charts.lines(per_step, "step", "positions", "generation", points=True,
                                    title="Positions run through the decoder at each step"), width="stretch")


def anti_diagonal_sentence(weight, S: int) -> str:
    """Whether a head reads the source from its end, as the measured ``weight`` (L, H) says."""
    best = np.unravel_index(int(np.argmax(weight)), weight.shape)
    head, w = names.head(*best), float(weight[best])
    if w >= kv_cache.READS_FROM_END:
        return (f" Here head {head} reads the source from its end: output position t puts on average {w:.2f} of its "
                f"weight on source position S + 1 − t (the anti-diagonal), where a uniform row puts 1/S = {1 / S:.3f}.")
    return (f" No head reads the source from its end here: the most any head puts on the anti-diagonal (output "
            f"position t on source position S + 1 − t) is {w:.2f} on average ({head}), where a uniform row puts "
            f"1/S = {1 / S:.3f} and a reversing head nearly 1.")


# 5. what the trained attention does -------------------------------------------------------------
st.header("5. The attention maps of this model")
panel_names = [f"layer {l + 1}, head {h + 1}" for l in range(stack.n_layers) for h in range(stack.n_heads)]
if setup.seq2seq:
    with recording(ran):
        cross = decoding.attention_weights(fcache, cfg, "cross")[:, 0]         # (L, H, T, S)
        reads_from_end = kv_cache.anti_diagonal_weight(cross)
    st.markdown(f"Cross-attention of validation example {i} (teacher forcing): one row per output position, "
                "one column per source digit." + (anti_diagonal_sentence(reads_from_end,
                                                                         cross.shape[-1]) if task == "reverse" else ""))
    st.vega_lite_chart(charts.heatmap_grid([cross[l, h] for l in range(stack.n_layers) for h in range(stack.n_heads)],
                                           charts.position_labels(shown(text_of(tgt_in))),
                                           charts.position_labels(tasks.digits_text(src)), panel_names,
                                           columns=stack.n_heads, size=150, annotate=False,
                                           row_title="decoder input", col_title="source"))
    st.caption("Compare the random-weight cross-attention on the page **Masks and cross-attention**: the same "
               + ("computation, but nothing there has learned where to look." if trained else
                  "computation; these weights are untrained too, so nothing here has learned where to look yet."))
else:
    with recording(ran):
        att = decoding.attention_weights(fcache, cfg)[:, 0]                    # (L, H, T, T)
    st.markdown(f"The language model has no cross-attention. Its causal self-attention on validation "
                f"window {i}: zero above the diagonal, as the mask demands.")
    labels = charts.position_labels(shown(text_of(tgt_in)))
    st.vega_lite_chart(charts.heatmap_grid([att[l, h] for l in range(stack.n_layers) for h in range(stack.n_heads)],
                                           labels, labels, panel_names, columns=stack.n_heads, size=200,
                                           annotate=False))


run = trainer.view()
track_ran = run.track if run.metrics else st.session_state[k("track")]
if sources := source_expander(f"Source: generation, and the {track_ran} training step"):
    with sources:
        st.caption("Teacher forcing, generation (with and without the cache), the attention it runs, and the sampler; "
                   f"then one {track_ran} training step, as a run takes it for each batch: "
                   + ("the one transformer's forward pass and hand-written backward pass, sublayer by sublayer, then Adam."
                      if track_ran == "readable" else "the same numbers as the readable step, in one Numba call, then "
                      "Adam." + ("" if setup.seq2seq else " That call is the same for every decoder: a decoder-only "
                                 "model skips its encoder and cross-attention.")))
        step_ran = step_record_of("decoder", cfg, track_ran)
        if step_ran is None:
            st.caption(STILL_COMPILING)
        else:
            ran.merge(step_ran)
        function_sources(ran)

state.publish(PAGE, spec_for(task))
