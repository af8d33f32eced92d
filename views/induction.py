"""Induction heads: two attention layers that copy what followed the last occurrence of a token."""

import numpy as np
import pandas as pd
import streamlit as st

from core.model import head_scores
from core.training import decoder_runs, induction
from core.training.steps import step_functions
from core import warmup
from ui import charts, state
from ui.widgets import function_sources


PAGE = "induction"
SETUP = induction.InductionSetup()
N, T, H = SETUP.half, 2 * SETUP.half - 1, SETUP.n_heads
MAX_STEPS = 2000                # about half a minute on two cores
SPEC = {"seed": state.int_field(0, 0, 999), "steps": state.int_field(SETUP.steps, 20, MAX_STEPS),
        "example": state.int_field(0, 0, SETUP.n_held_out - 1),
        "layer": state.int_field(2, 1, 2), "head": state.int_field(1, 1, H)}
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state


@st.cache_resource(show_spinner=False, max_entries=8)
def trained(seed: int, steps: int):
    """The model for a seed (the default one shipped with the app, any other trained once per server)
    and its measures on the held-out sequences."""
    setup = induction.InductionSetup(steps=steps)
    # the compiled step, or the readable one while a freshly started server still compiles it (named below)
    run = induction.default_run(setup, seed=seed, track=warmup.track(warmup.DECODER))
    data = induction.held_out(setup, seed)
    return run, data, induction.measure(run.params, run.cfg, data)


st.title("Induction heads")
state.restore(PAGE, SPEC)
st.markdown(
    "A two-layer transformer with **attention only** (no feed-forward sublayers) learns to continue "
    f"sequences of {N} random tokens that repeat once. The first half is unpredictable; the second half "
    "is predictable by in-context copying: *the last time I saw a it was followed by b, so predict b*. "
    "No single head can do this. A **previous-token head** in layer 1 writes \"the token before me\" into "
    "each position; an **induction head** in layer 2 then looks for the position whose predecessor was "
    "the current token, and copies what stands there.")
st.latex(r"x_{1..2n} = (a_1, \dots, a_n,\; a_1, \dots, a_n), \qquad n = %d,\ \text{%d token ids}"
         % (N, SETUP.vocab_size))

# 1. the model ------------------------------------------------------------------------------------
with st.form(k("train")):
    f1, f2 = st.columns(2)
    state.whole_number_input(f1, "Seed (initial weights and training sequences)", 0, 999, key=k("seed"))
    state.whole_number_input(f2, "Training steps", 20, MAX_STEPS, step=100, key=k("steps"),
                             help="With a few hundred steps the repeated half is not learned yet: no induction head.")
    st.form_submit_button("Train")
seed, steps = int(ss[k("seed")]), int(ss[k("steps")])
with st.spinner(f"Loading the shipped model, or training a two-layer attention-only model, {steps} steps (a few "
                "seconds, once per seed; "
                "ten to fifteen on a freshly started server, which trains on the readable step while it compiles)…"):
    run, (tgt_in, tgt_out), m = trained(seed, steps)
prev, ind = induction.head_verdicts(m)
prev_head, ind_head = prev.head, ind.head
c = st.columns(4)
c[0].metric("loss, first half", f"{m.loss_first_half:.3f}", help="Mean cross-entropy (nats) at query positions 1..n.")
c[1].metric("loss, repeated half", f"{m.loss_second_half:.3f}")
c[2].metric("accuracy, repeated half", f"{m.acc_second_half:.1%}")
c[3].metric(f"training ({run.track} step{', shipped' if run.shipped else ''})", f"{run.train_seconds:.1f} s",
            help=f"{steps} Adam steps of {SETUP.batch_size} fresh sequences, on the {run.track} training step"
                 + (" (this server was still compiling the compiled one)." if run.track == "readable" else ".")
                 + (" This default run was trained ahead and shipped with the app; its time was measured then. "
                    "Another seed or step count trains here." if run.shipped else ""))
st.caption(f"d_model = {SETUP.d_model}, {H} heads per layer, sinusoidal positions, post-norm LayerNorm; "
           f"measured on {SETUP.n_held_out} held-out sequences never seen in training. "
           f"A uniform guess costs ln {SETUP.vocab_size} = {np.log(SETUP.vocab_size):.3f}.")

# 2. the two heads on one sequence ----------------------------------------------------------------
st.header("Each layer's best-scoring head on one held-out sequence")
example = st.slider("Held-out sequence", 0, SETUP.n_held_out - 1, key=k("example"))
tokens = tgt_in[example]
labels = charts.position_labels([str(t) for t in tokens])
maps = m.attn[:, example]                                             # (L, H, T, T)
uniform_prev, uniform_ind = induction.uniform_baselines(T, N)


def title(v: induction.HeadVerdict) -> str:
    """A head's chart title: its role only when its score reaches the threshold."""
    where = f"Layer {v.layer + 1}, head {v.head + 1}"
    if v.formed:
        return f"{where}: {v.role} (score {v.score:.3f} ≥ {v.threshold:g})"
    return f"{where}: highest {v.role} score, {v.score:.3f} (< {v.threshold:g})"


left, right = st.columns(2)
left.vega_lite_chart(charts.heatmap(maps[0, prev_head], labels, labels, annotate=False, title=title(prev)))
right.vega_lite_chart(charts.heatmap(maps[1, ind_head], labels, labels, annotate=False, title=title(ind)))
st.caption(f"A head is named **previous-token** when at least {prev.threshold:g} of its weight, on average, sits one "
           f"step back (a uniform causal map scores {uniform_prev:.3f}), and **induction** when at least "
           f"{ind.threshold:g} sits on the position right after the earlier copy of the current token (uniform: "
           f"{uniform_ind:.3f}). Otherwise the chart shows the layer's best-scoring head, unnamed.")
if ind.formed:
    st.markdown(
        f"Right: from query position t in the second half the weight gathers at key t − {N - 1}, a diagonal "
        f"{N - 1} below the main one: the position **right after the earlier copy** of the current token, "
        "which holds the token to predict. In the first half no token has an earlier copy, so the head has "
        "nothing to find there.")
    if prev.formed:
        st.markdown("Left: each query looks one step back, the diagonal just below the main one; this is "
                    "where the induction head's keys get \"the token before me\" from.")
    else:
        st.markdown(
            f"Left: no layer-1 head puts, on average, {prev.threshold:g} of its weight one step back (the best, "
            f"L1H{prev.head + 1}, {prev.score:.3f}). The induction head still finds its targets, so "
            "\"the token before me\" reaches layer 2 another way: spread over several heads, or through "
            "the positions.")
else:
    st.warning(
        f"**No induction head formed** with seed {seed} after {steps:,} steps: every layer-2 head's induction "
        f"score is below {ind.threshold:g} (the best, L2H{ind.head + 1}, scores {ind.score:.3f}; a uniform map "
        f"{uniform_ind:.3f}), so no head shows the diagonal {N - 1} below the main one. "
        f"The repeated half's accuracy is {m.acc_second_half:.0%}"
        + (": whatever the model learned, it is not this copying rule." if m.acc_second_half > 0.2 else ".")
        + f" Try more steps (up to {MAX_STEPS:,}) or another seed.")

# 3. every head's scores --------------------------------------------------------------------------
st.header("Scores of every head")
st.latex(r"\text{induction}_h = \frac{1}{|\mathcal Q|}\sum_{t \in \mathcal Q} \sum_{j:\; x_{j-1} = x_t,\ j \le t} A^h_{t j}"
         r"\qquad \text{previous-token}_h = \frac{1}{T-1}\sum_{t=1}^{T-1} A^h_{t,\,t-1}")
st.caption(f"𝒬: the query positions whose token occurred earlier (the second half), averaged over the held-out "
           f"sequences. A uniform causal map scores {uniform_ind:.3f} (induction) and {uniform_prev:.3f} "
           "(previous token).")
scores = pd.DataFrame({"head": [f"L{l + 1}H{h + 1}" for l in range(2) for h in range(H)],
                       "induction": m.induction.ravel(), "previous token": m.previous.ravel()})
st.dataframe(scores.round(4), hide_index=True)
b1, b2 = st.columns(2)
b1.vega_lite_chart(charts.bar(scores["induction"], scores["head"], title="Induction score", x_title="head",
                              y_title="score"))
b2.vega_lite_chart(charts.bar(scores["previous token"], scores["head"], title="Previous-token score",
                              x_title="head", y_title="score"))

st.subheader("Any head")
s1, s2 = st.columns(2)
layer = s1.radio("Layer", [1, 2], key=k("layer"), horizontal=True)
head = s2.radio("Head", list(range(1, H + 1)), key=k("head"), horizontal=True)
one = maps[layer - 1, head - 1]
e1, e2, e3 = st.columns([1, 1, 2])
e1.metric(f"L{layer}H{head} induction", f"{m.induction[layer - 1, head - 1]:.4f}")
e2.metric(f"L{layer}H{head} previous token", f"{m.previous[layer - 1, head - 1]:.4f}")
e3.metric(f"L{layer}H{head} induction, this sequence",
          f"{float(head_scores.induction(one[None], tokens[None])):.4f}")
st.vega_lite_chart(charts.heatmap(one, labels, labels, annotate=False, title=f"Layer {layer}, head {head}"))

# 4. the loss along the sequence ------------------------------------------------------------------
st.header("Loss along the sequence")
st.latex(r"\mathcal L_{\text{first}} = \frac1n \sum_{t=0}^{n-1} \ell_t, \qquad "
         r"\mathcal L_{\text{repeated}} = \frac1{n-1} \sum_{t=n}^{2n-2} \ell_t, \qquad "
         r"\ell_t = -\log p(x_{t+1} \mid x_{\le t})")
curve = pd.DataFrame({"query position": np.arange(T), "loss": m.loss_by_position,
                      "half": ["first" if t < N else "repeated" for t in range(T)]})
st.vega_lite_chart(charts.lines(curve, "query position", "loss", "half", points=True,
                                title="Mean loss per position (held-out)", y_title="loss (nats)"))
best = induction.best_first_half_losses(SETUP)
announced = m.loss_by_position[N - 1]
st.markdown(
    f"First half **{m.loss_first_half:.3f}**, repeated half **{m.loss_second_half:.3f}** nats. Query positions "
    f"0 to {N - 2} predict a token not seen yet: at best ln(V − t − 1), from {best[0]:.3f} down to {best[-1]:.3f}, "
    f"since a half never repeats a token (this model: {m.loss_by_position[:N - 1].min():.3f} to "
    f"{m.loss_by_position[:N - 1].max():.3f}). Position {N - 1}, the last of the first half, predicts the first "
    f"repeated token, the sequence's first token: every sequence repeats at the same place, so the position "
    f"alone says where to look back. Its loss here is **{announced:.3f}**"
    + (", learned like the repeated half's." if announced < 0.5 * np.log(SETUP.vocab_size) else
       ", not learned yet."))

with st.expander(f"Source: the code that computed these numbers, and the {run.track} training step"):
    st.caption(f"The data and the head scores; then training: the loop, and the {run.track} step that trained "
               "this model" + (" (as it was trained ahead and shipped)." if run.shipped else "."))
    function_sources([induction.make_data, head_scores.induction_targets, head_scores.induction,
                      head_scores.previous_token, induction.measure, induction.default_run,
                      induction.train_induction, decoder_runs.train_on, *step_functions("decoder", run.track)])

state.publish(PAGE, SPEC)
