"""Induction heads: two attention layers that copy what followed the earlier copy of a token, and
the removal of the head the copying needs."""

import numpy as np
import pandas as pd
import streamlit as st

from core import warmup
from core.lessons import questions
from core.model import names
from core.lessons import head_kinds, induction
from core.recording import Record, recording
from ui import charts, lesson, state
from ui.step_source import STILL_COMPILING, step_record_of
from ui.widgets import function_sources, source_expander


PAGE = "induction"
SETUP = induction.InductionSetup()
L, T, H = SETUP.length, SETUP.length - 1, SETUP.n_heads
MAX_STEPS = 5000                # about ten seconds on two cores
SPEC = {"seed": state.int_field(0, 0, 999), "steps": state.int_field(SETUP.steps, 20, MAX_STEPS),
        "example": state.int_field(0, 0, SETUP.n_held_out - 1),
        "layer": state.int_field(2, 1, 2), "head": state.int_field(1, 1, H),
        "remove": state.bool_field(False), "how": state.choice_field("zero", induction.ABLATIONS)}
ABLATION_NAMES = {"zero": "zero (zero ablation)", "mean": "its mean over the sequence's positions (mean ablation)"}
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state


@st.cache_resource(show_spinner=False, max_entries=8)
def trained(seed: int, steps: int):
    """The model for a seed (the default one shipped with the app, any other trained once per server),
    its measures on the held-out sequences, and the record of what computed them (the training,
    timed on the page, runs outside it; the source shows one step of it)."""
    setup = induction.InductionSetup(steps=steps)
    # the compiled step, or the readable one while a freshly started server still compiles it (named below)
    run = induction.default_run(setup, seed=seed, track=warmup.track(warmup.DECODER))
    with recording() as ran:
        data = induction.held_out(setup, seed)
        m = induction.measure(run.params, run.cfg, data)
    return run, data, m, ran


@st.cache_resource(show_spinner="Removing each layer-1 head in turn and scoring the held-out sequences…",
                   max_entries=16)
def removals(seed: int, steps: int, how: str) -> list:
    """Each layer-1 head removed in turn (:func:`induction.layer_one_ablations`), for the model above,
    and the record of what computed them."""
    run, data, m, _ = trained(seed, steps)
    with recording() as ran:
        table = induction.layer_one_ablations(run.params, run.cfg, data, m, how)
    return table, ran


st.title("Induction heads")
state.restore(PAGE, SPEC)
lesson.header("induction")
unlocked = lesson.predict("induction")        # opens the removal of the previous-token head (section 4)
st.markdown(
    "A two-layer transformer with **attention only** (no feed-forward sublayers) learns to continue "
    f"sequences in which a segment of random tokens repeats. Each sequence holds {L} tokens: a prefix of random "
    f"length, a segment of n distinct random tokens (n from {SETUP.min_segment} to {SETUP.max_segment}), then the "
    "segment again and again to the end. The prefix and the segment's first copy cannot be predicted, nor can the "
    "second copy's first token (nothing says where the segment ends); every token after that can, by in-context "
    "copying: *the last time I saw a it was followed by b, so predict b*.")
st.markdown(
    "The segment starts at a different place and has a different length in every sequence, so no head that "
    "always looks the same number of positions back finds the answer in every sequence. Nor can one layer: a first-layer head's keys hold "
    "only each position's own token and place, not the token before it. Two layers can: a **previous-token "
    "head** in layer 1 writes \"the token before me\" into each position; an **induction head** in layer 2 then "
    "looks for the position whose predecessor was the current token, and copies what stands there.")
st.latex(r"x = (\underbrace{p_1, \dots, p_m}_{\text{prefix}},\ \underbrace{a_1, \dots, a_n}_{\text{segment}},\ "
         r"a_1, \dots, a_n,\ a_1, \dots), \qquad %d \le n \le %d,\ \ 0 \le m \le %d - 2n,\ \ \text{%d token ids}"
         % (SETUP.min_segment, SETUP.max_segment, L, SETUP.vocab_size))

# 1. the model ------------------------------------------------------------------------------------
with st.form(k("train")):
    f1, f2 = st.columns(2)
    state.whole_number_input(f1, "Seed (initial weights and training sequences)", 0, 999, key=k("seed"))
    state.whole_number_input(f2, "Training steps", 20, MAX_STEPS, step=100, key=k("steps"),
                             help="With a few hundred steps the repeat is not learned yet: no induction head.")
    st.form_submit_button("Train")
seed, steps = int(ss[k("seed")]), int(ss[k("steps")])
with st.spinner(f"Loading the shipped model, or training a two-layer attention-only model, {steps} steps (a few "
                "seconds, once per seed; "
                "longer on a freshly started server, which trains on the readable step while it compiles)…"):
    run, (tgt_in, tgt_out), m, measured = trained(seed, steps)
ran = Record()                     # what computes the numbers below, for the source at the end of the page
ran.merge(measured)
with recording(ran):
    prev, ind = induction.head_verdicts(m)
prev_name, ind_name = names.head(prev.layer, prev.head), names.head(ind.layer, ind.head)
c = st.columns(4)
c[0].metric("loss, first occurrence", f"{m.loss_first_occurrence:.3f}",
            help="Mean cross-entropy (nats) over the next tokens not seen before in their sequence.")
c[1].metric("loss, repeated segment", f"{m.loss_repeated_segment:.3f}",
            help="Mean cross-entropy (nats) over the next tokens that stand right after an earlier copy of the "
                 "current token.")
c[2].metric("accuracy, repeated segment", f"{m.acc_repeated_segment:.1%}")
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
with recording(ran):
    uniform_prev, uniform_ind = induction.uniform_baselines(tgt_in)
    prefixes, segments = induction.repeat_layout(tgt_in, tgt_out)
m_ex, n_ex = int(prefixes[example]), int(segments[example])
st.caption(f"This sequence: a prefix of {m_ex} tokens, the segment's {n_ex} tokens at positions {m_ex + 1} to "
           f"{m_ex + n_ex}, its copies from position {m_ex + n_ex + 1} on (positions counted from 1).")


def title(v: induction.HeadVerdict) -> str:
    """A head's chart title: its role only when its score reaches the threshold."""
    where = f"Layer {v.layer + 1}, head {v.head + 1}"
    if v.formed:
        return f"{where}: {v.role} (score {v.score:.3f} ≥ {v.threshold:g})"
    return f"{where}: highest {v.role} score, {v.score:.3f} (< {v.threshold:g})"


left, right = st.columns(2)
left.vega_lite_chart(charts.heatmap(maps[0, prev.head], labels, labels, annotate=False, title=title(prev)))
right.vega_lite_chart(charts.heatmap(maps[1, ind.head], labels, labels, annotate=False, title=title(ind)))
st.caption(f"A head is named **previous-token** when at least {prev.threshold:g} of its weight, on average, sits one "
           f"step back (a uniform causal map scores {uniform_prev:.3f}), and **induction** when at least "
           f"{ind.threshold:g} sits on the positions right after the earlier copies of the current token (uniform: "
           f"{uniform_ind:.3f}). Otherwise the chart shows the layer's best-scoring head, unnamed.")
if ind.formed:
    st.markdown(
        f"Right: from a query in the repeated segment, {ind_name} puts on average {ind.score:.0%} of its weight on "
        "the keys right after the earlier copies of the current token, which hold the token to predict. In this "
        f"sequence that key lies n − 1 = {n_ex - 1} positions back (a diagonal {n_ex - 1} below the main one; a "
        "later copy also finds the copies further back), in another sequence at another distance: the head "
        "finds it by the tokens, not by the position. Before the repeat no token has an earlier copy, so the "
        "head has nothing to find there.")
    if prev.formed:
        st.markdown(
            f"Left: {prev_name} puts on average {prev.score:.0%} of its weight one step back, the diagonal just below "
            "the main one. The maps suggest that the induction head's keys get \"the token before me\" from here; "
            "section 4 removes it to test that.")
    else:
        st.markdown(
            f"Left: no layer-1 head puts, on average, {prev.threshold:g} of its weight one step back (the best, "
            f"{prev_name}, {prev.score:.3f}). The induction head still finds its targets, so \"the token before me\" "
            "does reach layer 2, but no single layer-1 head carries it most of the time.")
else:
    st.warning(
        f"**No induction head formed** with seed {seed} after {steps:,} steps: every layer-2 head's induction "
        f"score is below {ind.threshold:g} (the best, {ind_name}, scores {ind.score:.3f}; a uniform map "
        f"{uniform_ind:.3f}), so no head's weight follows the earlier copies. "
        f"The repeated segment's accuracy is {m.acc_repeated_segment:.0%}"
        + (": whatever the model learned, it is not this two-head rule." if m.acc_repeated_segment > 0.2 else ".")
        + f" Try more steps (up to {MAX_STEPS:,}) or another seed.")

# 3. every head's scores --------------------------------------------------------------------------
st.header("Scores of every head")
st.latex(r"\text{induction}_h = \frac{1}{|\mathcal Q|}\sum_{t \in \mathcal Q} \sum_{j:\; x_{j-1} = x_t,\ j \le t} A^h_{t j}"
         r"\qquad \text{previous-token}_h = \frac{1}{T-1}\sum_{t=2}^{T} A^h_{t,\,t-1}")
st.caption(f"Positions t = 1 … T = {T}. 𝒬: the query positions whose token occurred earlier (the copies), over "
           f"every held-out sequence. A uniform causal map scores {uniform_ind:.3f} (induction) and "
           f"{uniform_prev:.3f} (previous token).")
heads = [names.head(l, h) for l in range(2) for h in range(H)]
scores = pd.DataFrame({"head": heads, "induction": m.induction.ravel(), "previous token": m.previous.ravel()})
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
chosen = names.head(layer - 1, head - 1)
e1, e2, e3 = st.columns([1, 1, 2])
e1.metric(f"{chosen} induction", f"{m.induction[layer - 1, head - 1]:.4f}",
          help=f"Papers write this head {names.paper_head(layer - 1, head - 1)} (counted from 0).")
e2.metric(f"{chosen} previous token", f"{m.previous[layer - 1, head - 1]:.4f}")
with recording(ran):
    one_score = float(head_kinds.induction(one[None], tokens[None]))
e3.metric(f"{chosen} induction, this sequence", f"{one_score:.4f}")
st.vega_lite_chart(charts.heatmap(one, labels, labels, annotate=False, title=f"Layer {layer}, head {head}"))

# 4. remove the previous-token head ---------------------------------------------------------------
st.header("Remove the previous-token head")
role = "previous-token head" if prev.formed else "highest previous-token score, not named"
st.markdown(
    "The maps suggest a mechanism; they do not show that the model uses it. An attention map is a diagnostic, "
    f"not an explanation. Test it: remove {prev_name} ({role}) by replacing its output o_h, at every position, "
    "before W_O, and score the same held-out sequences again. Layer 2 then reads a residual stream without what "
    f"{prev_name} wrote.")
r1, r2 = st.columns([1, 2])
remove = r1.toggle(f"Remove {prev_name}", key=k("remove"), disabled=not unlocked)
how = r2.radio("Replace its output by", induction.ABLATIONS, key=k("how"), format_func=ABLATION_NAMES.get,
               horizontal=True, disabled=not unlocked)
if not unlocked:
    st.caption("Answer the question at the top of the page first: removing the head shows its answer.")
elif remove:
    table, removed = removals(seed, steps, how)
    ran.merge(removed)
    a = table[prev.head]
    d1, d2, d3 = st.columns(3)
    d1.metric(f"best layer-2 induction score without {prev_name}", f"{a.induction_after:.3f}",
              f"{a.induction_after - a.induction_before:+.3f}")
    d2.metric(f"accuracy, repeated segment, without {prev_name}", f"{a.acc_after:.1%}",
              f"{100 * (a.acc_after - a.acc_before):+.1f} points")
    d3.metric(f"loss, repeated segment, without {prev_name}", f"{a.loss_after:.3f}",
              f"{a.loss_after - a.loss_before:+.3f}", delta_color="inverse")
    with recording(ran):
        outcome = induction.ablation_outcome(a)
    change = (f"Without {prev_name} layer 2's best induction score goes from {a.induction_before:.3f} to "
              f"{a.induction_after:.3f} ({a.induction_ratio:.0%} of itself) and the repeated segment's accuracy from "
              f"{a.acc_before:.1%} to {a.acc_after:.1%}")
    if outcome == induction.FELL_TO_HALF_OR_LESS:
        change += (": half or less of the weight on the positions after the earlier copies is left"
                   + (f", although {prev_name} itself looks one step back, not at the token to predict" if prev.formed
                      else "") + ".")
    elif outcome == induction.FELL_LESS_THAN_HALF:
        change += (f": more than half of the score stays, so layer 2 does not depend on {prev_name} alone "
                   "(\"the token before me\" reaches it another way as well).")
    else:
        change += f": removing {prev_name} does not lower it."
    if a.acc_after <= 0.5 * a.acc_before:
        change += " The copying goes with it: the accuracy falls to half of itself or less."
    elif a.acc_after >= a.acc_before - 0.01:
        change += f" The repeated segment is predicted about as well as before: the copying did not need {prev_name}."
    st.markdown(change)
    after_map = a.after.attn[1, example, ind.head]
    st.vega_lite_chart(charts.heatmap(after_map, labels, labels, annotate=False,
                                      title=f"Layer 2, head {ind.head + 1} with {prev_name} removed"))
    st.caption(f"The same held-out sequence as in section 2; {ind_name}'s map with the model intact is section 2's "
               "right-hand chart.")
    control = pd.DataFrame({
        "head removed": ["none"] + [names.head(0, h) for h in range(H)],
        "best layer-2 induction score": [a.induction_before] + [r.induction_after for r in table],
        "accuracy, repeated segment": [a.acc_before] + [r.acc_after for r in table],
        "loss, repeated segment": [a.loss_before] + [r.loss_after for r in table]})
    st.dataframe(control.round(4), hide_index=True)
    st.caption("Each layer-1 head removed in turn, the same way: the control. A head whose removal changes "
               "little was not needed for the copying, however its map looks.")
lesson.ask(questions.of_page(PAGE)[1])

# 5. the loss along the sequence ------------------------------------------------------------------
st.header("Loss along the sequence")
st.latex(r"\mathcal L_{\text{first}} = \operatorname{mean}_{t \in \mathcal F}\, \ell_t, \qquad "
         r"\mathcal L_{\text{repeated}} = \operatorname{mean}_{t \in \mathcal R}\, \ell_t, \qquad "
         r"\ell_t = -\log p(x_{t+1} \mid x_{\le t}),\ \ t = 1, \dots, T")
st.caption("𝓕: the query positions whose next token has not occurred yet in its sequence; 𝓡: those whose next "
           "token stands right after an earlier copy of the current one (the repeated segment); over every "
           "held-out sequence.")
positions = np.arange(1, T + 1)
curve = pd.concat([pd.DataFrame({"query position": positions, "loss": values, "next token": kind})
                   for kind, values in (("first occurrence", m.loss_first), ("repeated segment", m.loss_repeated))])
curve = curve[np.isfinite(curve["loss"])]
st.vega_lite_chart(charts.lines(curve, "query position", "loss", "next token", points=True,
                                title="Mean loss per position (held-out)", y_title="loss (nats)"))
with recording(ran):
    floor = induction.first_occurrence_floor(tgt_in, tgt_out, SETUP.vocab_size)
st.markdown(
    f"First occurrence **{m.loss_first_occurrence:.3f}**, repeated segment **{m.loss_repeated_segment:.3f}** nats. "
    "A first occurrence after k distinct tokens is any of the V − k tokens not seen yet, alike, so on average no "
    f"model does better than ln(V − k) there: **{floor:.3f}** nats over these sequences. The repeat's first token "
    f"(one per sequence) costs **{m.loss_repeat_start:.3f}**: the token before it has no earlier copy, so the "
    "sequence so far does not say that the segment has ended.")

if sources := source_expander(f"Source: the code that computed these numbers, and the {run.track} training step"):
    with sources:
        st.caption(f"The data, the measures and the removals; then one {run.track} training step, as the run that "
                   "trained this model took each of its steps" + (" (trained ahead and shipped)." if run.shipped else "."))
        step_ran = step_record_of("decoder", run.cfg, run.track)
        if step_ran is None:
            st.caption(STILL_COMPILING)
        else:
            ran.merge(step_ran)
        function_sources(ran)

state.publish(PAGE, SPEC)
