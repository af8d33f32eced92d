"""Multi-head attention with every head set by hand: a grid of patterns, and one head opened up."""
import numpy as np
import pandas as pd
import streamlit as st

from core import masks
from core.lessons import analysis
from core.lessons import heads, questions
from core.attention import attention
from core.limits import MAX_D_K, MAX_HEADS, MAX_MATRIX_ENTRY, MAX_TOKENS
from ui import charts, lesson, state
from core.kernels.dispatch import lesson_recording
from core.recording import Record, recording
from ui.widgets import chosen_backend, chosen_dtype, ensure_kernels, kernel_source


PAGE = "multi_head"
FILTERS = {"first_token": "first-sample hold", "previous_token": "unit delay z⁻¹", "self": "identity",
           "nearby": "local window", "uniform": "growing box", "two_positions": "two taps", "custom": "your own filter"}
SPEC = {"T": state.int_field(6, 2, MAX_TOKENS), "d_k": state.int_field(2, 1, MAX_D_K),
        "H": state.int_field(4, 1, MAX_HEADS), "causal": state.bool_field(True),
        "open": state.int_field(4, 1, MAX_HEADS), "row": state.int_field(4, 1, MAX_TOKENS)}
for h in range(1, MAX_HEADS + 1):  # heads 5..8 repeat the lesson's four (exercise 3)
    SPEC[f"p{h}"] = state.choice_field(heads.LESSON_HEADS[(h - 1) % 4], tuple(heads.PRESETS))
    SPEC[f"g{h}"] = state.float_field(heads.DEFAULT_GAIN, 0.0, 10.0)
    SPEC[f"q{h}"], SPEC[f"k{h}"] = state.matrix_field(), state.matrix_field()
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state

st.title("Multi-head attention, set by hand")
ensure_kernels("attention_with_scores")
state.restore(PAGE, SPEC)
lesson.header("multi_head")
unlocked = lesson.predict("multi_head")
st.latex(r"A_h = \mathrm{softmax}\!\left(\frac{Q_h K_h^\top}{\sqrt{d_k}} + M\right), \quad h = 1..H, "
         r"\qquad M \text{ shared by every head}")
st.markdown("Each head's queries and keys are set by a recipe (below each head's box) instead of being "
            "learned. **Attention itself has no notion of order**: computed from the tokens' vectors alone, "
            "a head's weights are only reordered when the tokens are. The previous-token, self and "
            "nearby-window recipes are *given* each token's position by hand: they write the index t into "
            "its query and key (a point at angle 2πt/T on a circle, or t itself, centred), and that alone is "
            "how they find the token before, or themselves. In a trained model nobody writes t in: it comes from the "
            "positional encoding added to the input. The first-token recipe is a content head instead: it "
            "looks for a feature that only token 1's key carries.")
lesson.link("positional", label="Positional encoding: where a model gets positions from")

# 1. sizes and the shared mask
c = st.columns(4)
state.whole_number_input(c[0], f"T (tokens, at most {MAX_TOKENS})", 2, MAX_TOKENS, key=k("T"))
state.whole_number_input(c[1], f"d_k (head width, at most {MAX_D_K})", 1, MAX_D_K, key=k("d_k"))
state.whole_number_input(c[2], f"H (heads, 1 to {MAX_HEADS})", 1, MAX_HEADS, key=k("H"))
c[3].toggle("Shared causal mask", key=k("causal"))
T, d_k, H = int(ss[k("T")]), int(ss[k("d_k")]), int(ss[k("H")])
labels = [f"t{i + 1}" for i in range(T)]

# 2. one preset and one gain per head; every number below is computed inside `ran`'s blocks
ran = Record()
Qs, Ks, extra, zeroed = np.zeros((H, T, d_k)), np.zeros((H, T, d_k)), {}, set()
for h in range(1, H + 1):
    if (h - 1) % 4 == 0:
        col_row = st.columns(4)
    with col_row[(h - 1) % 4]:
        name = st.selectbox(f"Head {h}", list(heads.PRESETS), key=k(f"p{h}"),
                            format_func=lambda p: heads.PRESETS[p].label)
        st.slider(f"gain of head {h}", 0.0, 10.0, step=0.5, key=k(f"g{h}"),
                  disabled=name in ("uniform", "custom"))
        st.caption(heads.PRESETS[name].description)
        try:
            if name == "custom":
                zero, cols = np.zeros((T, d_k)), [f"f{j + 1}" for j in range(d_k)]
                with st.expander(f"Q_{h} and K_{h}"):
                    Qs[h - 1] = state.matrix_input(PAGE, f"q{h}", zero, labels, cols, label=f"Q_{h}",
                                                   limit=MAX_MATRIX_ENTRY, row_title="token")
                    Ks[h - 1] = state.matrix_input(PAGE, f"k{h}", zero, labels, cols, label=f"K_{h}",
                                                   limit=MAX_MATRIX_ENTRY, row_title="token")
                extra.update({f"q{h}": Qs[h - 1] if Qs[h - 1].any() else None,
                              f"k{h}": Ks[h - 1] if Ks[h - 1].any() else None})
            else:
                with recording(ran):
                    Qs[h - 1], Ks[h - 1] = heads.build_head(name, T, d_k, ss[k(f"g{h}")])
        except ValueError as err:
            st.warning(f"Head {h}: {err} It uses zero queries and keys instead.")
            zeroed.add(h)
active = ["T", "d_k", "H", "causal", "open", "row"] + [f"{p}{h}" for h in range(1, H + 1) for p in "pgqk"]
told = [h for h in range(1, H + 1) if ss[k(f"p{h}")] in heads.POSITIONAL_PRESETS and h not in zeroed]
st.markdown(f"Heads given each token's position by hand here: **{', '.join(map(str, told)) or 'none'}**.")

# 3. all heads at once, on one colour scale; the scores S are the ones the weights' kernels computed
mask = masks.causal(T) if ss[k("causal")] else None
dtype, backend = chosen_dtype(), chosen_backend()
V = np.broadcast_to(np.eye(T, dtype=dtype), (H, T, T)).copy()   # one-hot values: output row = weight row
try:
    with lesson_recording(ran):
        _, A, S = attention(Qs.astype(dtype), Ks.astype(dtype), V, mask, backend=backend, return_scores=True)
except ValueError as err:
    state.publish(PAGE, SPEC, active, extra)
    st.error(str(err))
    st.stop()
titles = [f"Head {h + 1}: {heads.PRESETS[ss[k(f'p{h + 1}')]].label}" for h in range(H)]
if unlocked:
    st.vega_lite_chart(charts.heatmap_grid(list(A), labels, labels, titles, annotate=T <= 8))
else:
    st.info("The heads' maps appear once you have answered the question at the top.")

# 4. one head opened up
st.subheader("Open one head")
if ss[k("open")] > H:
    state.settle(PAGE, "open", H, f"there are {H} heads, so the last head to open is {H}.")
if ss[k("row")] > T:
    state.settle(PAGE, "row", T, f"there are {T} tokens, so the last query row is {T}.")
c = st.columns(2)
c[0].selectbox("Head", list(range(1, H + 1)), key=k("open"), format_func=lambda h: titles[h - 1],
               disabled=not unlocked)
c[1].slider("Query row t (its impulse response)", 1, T, key=k("row"), disabled=not unlocked)
state.publish(PAGE, SPEC, active, extra)
if not unlocked:
    st.stop()
h, t = int(ss[k("open")]), int(ss[k("row")])
preset = ss[k(f"p{h}")]
c = st.columns(3)
c[0].vega_lite_chart(charts.heatmap(np.where(np.isfinite(S[h - 1]), S[h - 1], np.nan), labels, labels,
                                 title=f"Scores of head {h} (masked: blank)", kind="signed",
                                 value_name="score", size=220))
c[1].vega_lite_chart(charts.heatmap(A[h - 1], labels, labels, title=f"Weights of head {h}", size=220))
c[2].vega_lite_chart(charts.stem(A[h - 1, t - 1], title=f"Row {t}: {FILTERS[preset]}"))
with recording(ran):
    bits = analysis.row_entropy_bits(A[h - 1])
    ceiling = analysis.entropy_ceiling_bits(T, causal=mask is not None)
    ranks = np.atleast_1d(analysis.score_rank(Qs, Ks))
    every_bits = [analysis.row_entropy_bits(A[i]) for i in range(H)]
    costs = [analysis.wide_vs_narrow_score_flops(T_, d_, H_) for T_, d_, H_ in ((T, H * d_k, H), (1024, 512, 8))]
st.markdown(f"Row {t} of head {h}: `[{', '.join(f'{w:.4f}' for w in A[h - 1, t - 1])}]`  \n"
            f"Entropy **{bits[t - 1]:.4f} bits** (ceiling log2 of the visible keys: {ceiling[t - 1]:.4f}), "
            f"so about **{2 ** bits[t - 1]:.2f}** effective positions.")
st.markdown(f"rank(Q_h K_hᵀ) for heads 1..{H}: **{', '.join(map(str, ranks))}** "
            f"(budget: d_k = {d_k} per head)")

# 4b. every head's impulse response at row t, side by side
st.subheader(f"Impulse responses at row {t}, every head side by side")
for first in range(0, H, 4):
    cols = st.columns(4)
    for i in range(first, min(first + 4, H)):
        cols[i - first].vega_lite_chart(charts.stem(A[i, t - 1], title=f"head {i + 1}: {FILTERS[ss[k(f'p{i + 1}')]]}"))
st.dataframe(pd.DataFrame(A[:, t - 1], columns=labels).assign(
    **{"impulse response": [f"head {i + 1}: {FILTERS[ss[k(f'p{i + 1}')]]}" for i in range(H)]})[["impulse response", *labels]]
    .round(4), hide_index=True)
st.caption("Row t of each A_h is the filter that head applies at time t: its taps are non-negative and sum to 1.")

# 5. selectivity of every head, and the cost of many narrow heads
st.subheader("Selectivity in bits (rows: query position t)")
table = pd.DataFrame({"t": np.arange(1, T + 1), "ceiling (bits)": ceiling})
for i in range(H):
    table[f"head {i + 1}"] = every_bits[i]
st.dataframe(table.round(6), hide_index=True)
lesson.ask(questions.by_key("multi_head.copied_heads"))
st.subheader("One wide head or H narrow ones")
st.latex(r"\underbrace{2 T^2 d_\text{model}}_{\text{one head of width } d_\text{model}} \;=\; "
         r"\underbrace{H \cdot 2 T^2 \tfrac{d_\text{model}}{H}}_{H \text{ heads of width } d_\text{model}/H}")
rows = []
for (T_, d_, H_), cost in zip(((T, H * d_k, H), (1024, 512, 8)), costs):
    rows.append({"T": T_, "d_model": d_, "H": H_, "d_k": cost.d_k, "one wide head": cost.one_wide_head,
                 "H narrow heads": cost.narrow_heads})
count = st.column_config.NumberColumn(format="localized")   # 1,073,741,824: thousands separated
st.dataframe(pd.DataFrame(rows), hide_index=True, column_config={"one wide head": count, "H narrow heads": count})
st.markdown("""**What to look for.** With the causal mask every heatmap is lower-triangular and each
row sums to 1, yet the heads mix the past in different ways: a hold on the first sample, a delay of
one, the identity, a growing average. Raise a gain and the soft patterns sharpen (fewer bits, closer to
one effective position); the uniform head sits on the ceiling whatever you do. A rank never exceeds
d_k, and splitting d_model into H heads costs the same score FLOPs as one wide head.""")
kernel_source(ran)
