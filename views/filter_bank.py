"""Concatenation, the output projection W_O, and multi-head attention read as a filter bank."""
import numpy as np
import pandas as pd
import streamlit as st

from core import masks
from core.lessons import analysis
from core.lessons import heads, questions
from core.attention import filter_bank, multi_head_attention
from core.limits import MAX_MATRIX_ENTRY
from ui import charts, lesson, state
from core.kernels.dispatch import lesson_recording
from ui.widgets import as_shown, chosen_backend, chosen_dtype, ensure_kernels, kernel_source


PAGE = "filter_bank"
H, D_V, D = 2, 2, 4                                # the lesson's pipeline: T = d_model = 4
VALUE_CHOICES = {"lesson": "lesson: head 1 reads x3, x4; head 2 reads x1, x2",
                 "in_order": "in order: head 1 reads x1, x2; head 2 reads x3, x4",
                 "random": "random (seeded)", "custom": "typed by hand"}
SPEC = {"wv": state.choice_field("lesson", tuple(VALUE_CHOICES)),
        "wo": state.choice_field("lesson_mixing", tuple(heads.W_O_PRESETS)),
        "seed": state.int_field(0, 0, 9999), "gain": state.float_field(heads.DEFAULT_GAIN, 0.0, 10.0),
        "causal": state.bool_field(True), "WV": state.matrix_field(), "WO": state.matrix_field()}
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state
tokens, xs = [f"t{i + 1}" for i in range(D)], [f"x{i + 1}" for i in range(D)]
concat_cols = [f"h{h + 1}.{j + 1}" for h in range(H) for j in range(D_V)]
out_cols = [f"d{j + 1}" for j in range(D)]

st.title("Concat, W_O and the filter bank")
ensure_kernels("project_heads", "attention_with_weights", "merge_heads_project", "weighted_sum")
state.restore(PAGE, SPEC)
lesson.header("filter_bank")
unlocked = lesson.predict("filter_bank")
st.latex(r"\mathrm{Concat} = [O_1, O_2], \qquad O = \mathrm{Concat}\, W_O "
         r"= \sum_{h} A_h\, X\, \underbrace{W_V^h\, W_O^{(h)}}_{\text{OV circuit of head } h}")
st.markdown("The lesson's two-head pipeline: T = 4 one-hot tokens (X = I), head 1 attends to itself "
            "(circle code), head 2 averages the past; d_k = d_v = 2, d_model = 4.")

# 1. the student's value projections and output projection
c = st.columns([2, 1, 1, 1])   # the W_V choices are long sentences: the widest column
c[0].selectbox("Value projections W_V", list(VALUE_CHOICES), key=k("wv"), format_func=VALUE_CHOICES.get)
c[1].selectbox("W_O preset", list(heads.W_O_PRESETS), key=k("wo"), disabled=not unlocked)
state.whole_number_input(c[2], "Seed (random choices)", 0, 9999, key=k("seed"))
c[3].slider("Gain of head 1", 0.0, 10.0, step=0.5, key=k("gain"))
st.toggle("Causal mask", key=k("causal"))
st.caption(heads.W_O_PRESETS[ss[k("wo")]])
pipe = heads.two_head_pipeline(gain=ss[k("gain")])
eye, rng = np.eye(D), np.random.default_rng(int(ss[k("seed")]))
W_V = {"lesson": pipe.W_V, "in_order": eye, "random": rng.normal(size=(D, H * D_V)), "custom": pipe.W_V}[ss[k("wv")]]
left, right = st.columns(2)
with left:
    st.caption("W_V (rows: input features; columns: head value dimensions)")
    if ss[k("wv")] == "custom":
        W_V = state.matrix_input(PAGE, "WV", pipe.W_V, xs, concat_cols, label="W_V", limit=MAX_MATRIX_ENTRY,
                                 row_title="input feature")
    else:
        st.vega_lite_chart(charts.heatmap(W_V, xs, concat_cols, kind="signed", value_name="value",
                                          row_title="input feature", col_title="value dimension", size=160))
preset_W_O = heads.output_projection(ss[k("wo")], H, D_V, seed=int(ss[k("seed")]))
with right:
    st.caption("W_O, editable (rows: the concat column read; columns: the output channel written)")
    # one editor per preset (and per seed for the random one), so a new choice shows its own matrix
    preset_name = ss[k("wo")] + (f".{int(ss[k('seed')])}" if ss[k("wo")] == "random" else "")
    W_O = state.matrix_input(PAGE, "WO", preset_W_O, concat_cols, out_cols, label="W_O",
                             editor_key=k(f"WO.{preset_name}"), limit=MAX_MATRIX_ENTRY, row_title="concat column")
state.publish(PAGE, SPEC, extra={"WV": W_V if ss[k("wv")] == "custom" and not np.array_equal(W_V, as_shown(pipe.W_V)) else None,
                                 "WO": None if np.array_equal(W_O, as_shown(preset_W_O)) else W_O})

# 2. run the block, then its filter-bank decomposition
dtype, backend = chosen_dtype(), chosen_backend()
mask = masks.causal(D) if ss[k("causal")] else None
try:
    with lesson_recording() as ran:
        args = [m.astype(dtype) for m in (pipe.X, pipe.W_Q, pipe.W_K, W_V, W_O)]
        res = multi_head_attention(*args, H, mask, backend=backend)
        terms = filter_bank(args[0], args[3], args[4], res.weights, H, backend=backend)   # (H, T, d_model)
except ValueError as err:
    st.error(str(err))
    st.stop()
signed = dict(kind="signed", value_name="value", size=200)
c = st.columns(3)
c[0].vega_lite_chart(charts.heatmap(W_O, concat_cols, out_cols, title="W_O (H·d_v × d_model)",
                                         row_title="concat column", col_title="output channel", **signed))
c[1].vega_lite_chart(charts.heatmap(res.concat, tokens, concat_cols, title="Concat = [O_1, O_2]",
                                         row_title="token", col_title="concat column", **signed))
c[2].vega_lite_chart(charts.heatmap(res.output, tokens, out_cols, title="O = Concat · W_O",
                                         row_title="token", col_title="output channel", **signed))
with st.expander("Concat and O as numbers", expanded=True):
    n = st.columns(2)
    n[0].dataframe(pd.DataFrame(res.concat, index=tokens, columns=concat_cols).round(6))
    n[1].dataframe(pd.DataFrame(res.output, index=tokens, columns=out_cols).round(6))

st.subheader("Two circuits per head")
st.markdown("Head h reads the tokens through two products of its weights. **W_Q^h W_K^hᵀ** (d_model × "
            "d_model) is its **QK circuit**: it sets which tokens attend to which, A_h = softmax(X W_Q^h "
            "W_K^hᵀ Xᵀ / √d_k + M). **W_V^h W_O^(h)** (d_model × d_model) is its **OV circuit**: what a token "
            "read by head h writes into the output, W_O^(h) being the block of rows of W_O that reads head h. "
            "Each term of the filter bank below is the head's map followed by its OV circuit, "
            "A_h X (W_V^h W_O^(h)). Here X = I (token i is the one-hot x_i), so a QK circuit's entry (i, j) is "
            "query token i's raw score for key token j, and an OV circuit's row i is what token i writes when "
            "the head reads it.")
qk = analysis.qk_circuits(pipe.W_Q, pipe.W_K, H)                   # (H, d_model, d_model)
ov = analysis.ov_circuits(W_V, W_O, H)                              # (H, d_model, d_model)
qk_row, ov_row = st.columns(H), st.columns(H)
for h in range(H):
    qk_row[h].vega_lite_chart(charts.heatmap(qk[h], xs, xs, title=f"QK circuit of head {h + 1}", kind="signed",
                                             value_name="value", row_title="query feature",
                                             col_title="key feature", size=200))
    ov_row[h].vega_lite_chart(charts.heatmap(ov[h], xs, out_cols, title=f"OV circuit of head {h + 1}",
                                             kind="signed", value_name="value", row_title="input feature",
                                             col_title="output channel", size=200))

st.subheader("The filter bank: one term per head")
total = terms.sum(axis=0)
if unlocked:
    panels = [*terms, total, res.output]
    titles = [f"head {h + 1}: A_{h + 1} X W_V^{h + 1} W_O^({h + 1})" for h in range(H)] + ["sum of the terms",
                                                                                         "Concat · W_O"]
    st.vega_lite_chart(charts.heatmap_grid(panels, tokens, out_cols, titles, kind="signed", value_name="value",
                                           columns=4, row_title="token", col_title="output channel"))
    deviation = float(np.max(np.abs(total - res.output)))
    st.metric("max |Σ_h term_h − Concat·W_O|", f"{deviation:.2e}")
else:
    st.info("The terms, their sum and Concat·W_O appear once you have answered the question at the top.")

# 3. which output channels listen to more than one head
mixing = analysis.channels_mixing_heads(W_O, H)
per_channel = analysis.heads_per_channel(W_O, H)
st.subheader("Which output channels read more than one head")
st.write(", ".join(f"{c}: {n} head(s)" for c, n in zip(out_cols, per_channel)))
st.markdown(f"Channels mixing heads: **{', '.join(out_cols[j] for j in mixing) or 'none'}**")
if lesson.ask(questions.by_key("filter_bank.w_o_mixing")):
    identity = multi_head_attention(*args[:4], np.eye(H * D_V, dtype=dtype), H, mask, backend=backend)
    swap = heads.swap_head_blocks(H, D_V)
    st.info(f"With W_O = I (exercise 1): O equals Concat (max |O − Concat| = "
            f"{np.max(np.abs(identity.output - identity.concat)):.1e}) and channels mixing heads: "
            f"{', '.join(out_cols[j] for j in analysis.channels_mixing_heads(np.eye(H * D_V), H)) or 'none'}: "
            "each channel copies one head, so the heads never meet. Swapping the head blocks only relabels "
            "the channels; channels mixing heads: "
            f"{', '.join(out_cols[j] for j in analysis.channels_mixing_heads(swap, H)) or 'none'}.")
st.markdown("""**What to look for.** Each head's term is its own attention pattern (the analysis
filter A_h, along the tokens) followed by its OV circuit W_V^h W_O^(h), whose rows of W_O are the
synthesis filter, across the channels. Compare the sum of the terms with Concat · W_O, and read the
difference in the metric under them. A channel whose column of W_O has entries in both row blocks
carries information from both heads: that is what W_O is for. Signed entries (d3 = −h2.1 in the
lesson's W_O) show in blue and red around a white zero.""")
kernel_source(ran)
