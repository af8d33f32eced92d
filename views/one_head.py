"""One head: scaled dot-product attention on a sentence you type."""
import numpy as np
import streamlit as st

from core import masks
from core.lessons import analysis
from core.lessons import heads
from core.attention import attention
from core.limits import MAX_D_K_ONE_HEAD, MAX_MATRIX_ENTRY, MAX_TOKENS
from ui import charts, lesson, state
from core.kernels.dispatch import lesson_recording
from core.recording import recording
from ui.widgets import (as_shown, chosen_backend, chosen_dtype, ensure_kernels, kernel_source,
                        tokens_from)


PAGE = "one_head"
SPEC = {
    "sentence": state.text_field("The tired cat sat on the warm mat"),
    "source": state.choice_field("random", ("random", "hand")),
    "seed": state.int_field(0, 0, 9999),
    "d_k": state.int_field(2, 1, MAX_D_K_ONE_HEAD),
    "scaled": state.bool_field(True),
    "temperature": state.float_field(1.0, 0.1, 5.0),
    "causal": state.bool_field(True),
    "query": state.int_field(4, 1, MAX_TOKENS),
    "Q": state.matrix_field(),
    "K": state.matrix_field(),
}
k = lambda name: state.key(PAGE, name)  # noqa: E731

st.title("One head: scaled dot-product attention")
ensure_kernels("attention_with_scores", "attention_with_weights")
state.restore(PAGE, SPEC)
lesson.header("one_head")
unlocked = lesson.predict("one_head")
st.latex(r"S = \frac{Q K^\top}{\sqrt{d_k}\,\tau} + M, \qquad A = \mathrm{softmax}_{\text{row}}(S), "
         r"\qquad \mathrm{out} = A V")
st.markdown("In a model, the queries, keys and values are made from the layer's input X (one row per "
            "token) by three learned matrices: Q = X W_Q, K = X W_K, V = X W_V. Here you set Q and K "
            "directly (drawn at random, or typed), and V = I, the T × T identity: token j's value is the "
            "one-hot vector e_j, so out = A V = A and each output row *is* its weight row.")

# 1. the sentence becomes the token labels
state.vet(PAGE, "sentence", lambda text: tokens_from(text, max_tokens=MAX_TOKENS))
st.text_input(f"Sentence (at most {MAX_TOKENS} words; each word is one token)", key=k("sentence"))
try:
    tokens = tokens_from(st.session_state[k("sentence")], max_tokens=MAX_TOKENS)
except ValueError as err:
    st.error(str(err))
    state.publish(PAGE, SPEC)
    st.stop()
T, labels = len(tokens), charts.position_labels(tokens)
if st.session_state[k("query")] > T:      # the query row read in step 4, settled before the link is written
    state.settle(PAGE, "query", T, f"the sentence has {T} words, so its last query row is {T}.")

# 2. queries and keys, and how the scores are turned into weights
left, right = st.columns(2)
left.radio("Queries and keys", ["random", "hand"], key=k("source"), horizontal=True,
           format_func={"random": "drawn at random (seeded)", "hand": "typed by hand"}.get)
state.whole_number_input(left, "d_k (width of a query or key)", 1, MAX_D_K_ONE_HEAD, key=k("d_k"),
                         help=f"From 1 to {MAX_D_K_ONE_HEAD}.")
state.whole_number_input(left, "Random seed", 0, 9999, key=k("seed"))
right.toggle("Divide by √d_k", key=k("scaled"), disabled=not unlocked)
right.slider("Temperature τ (large: flatter; small: sharper)", 0.1, 5.0, step=0.1, key=k("temperature"))
right.toggle("Causal mask (no looking at later words)", key=k("causal"))
d_k = int(st.session_state[k("d_k")])
rng = np.random.default_rng(int(st.session_state[k("seed")]))
drawn_Q, drawn_K = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k))
Q, K = drawn_Q, drawn_K
if st.session_state[k("source")] == "hand":
    cols = [f"f{j + 1}" for j in range(d_k)]
    a, b = st.columns(2)
    with a:
        st.caption("Q (one row per token)")
        Q = state.matrix_input(PAGE, "Q", drawn_Q, labels, cols, label="Q", limit=MAX_MATRIX_ENTRY, row_title="token")
    with b:
        st.caption("K (one row per token)")
        K = state.matrix_input(PAGE, "K", drawn_K, labels, cols, label="K", limit=MAX_MATRIX_ENTRY, row_title="token")
scale = (1.0 / np.sqrt(d_k) if st.session_state[k("scaled")] else 1.0) / st.session_state[k("temperature")]
mask = masks.causal(T) if st.session_state[k("causal")] else None
hand = st.session_state[k("source")] == "hand"
state.publish(PAGE, SPEC, extra={"Q": Q if hand and not np.array_equal(Q, as_shown(drawn_Q)) else None,
                                  "K": K if hand and not np.array_equal(K, as_shown(drawn_K)) else None})

# 3. scores and weights (V = I: each output row is its weight row); the scores S are the ones the
# weights' kernels computed on the way. Every number below is computed inside `ran`'s blocks.
dtype, backend = chosen_dtype(), chosen_backend()
try:
    with lesson_recording() as ran:
        out, A, S = attention(Q.astype(dtype), K.astype(dtype), np.eye(T, dtype=dtype), mask, scale=scale,
                              backend=backend, return_scores=True)
except ValueError as err:
    st.error(str(err))
    st.stop()
S_shown = np.where(np.isfinite(S), S, np.nan)  # masked cells stay blank
c1, c2 = st.columns(2)
c1.vega_lite_chart(charts.heatmap(S_shown, labels, labels, title="Scores S (masked cells blank)", kind="signed",
                               value_name="score"))
c2.vega_lite_chart(charts.heatmap(A, labels, labels, title="Weights A = softmax(S)"))
with recording(ran):
    sum_error, entropies = analysis.max_row_sum_error(A), analysis.row_entropy_bits(A)
m1, m2 = st.columns(2)
m1.metric("max |row sum − 1| over all rows", f"{sum_error:.1e}")
m2.metric("mean row entropy (bits)", f"{entropies.mean():.3f}",
          help="How spread out the rows are, on average: 0 when every row puts all its weight on one key.")
with st.expander("The numbers behind the heatmaps"):
    feats = [f"f{j + 1}" for j in range(d_k)]
    for name, M, cols, caption in (("Q", Q, feats, "Q: one row per token"), ("K", K, feats, "K: one row per token"),
                                   ("S", S_shown, labels, "S: rows are queries, columns keys; masked cells blank"),
                                   ("A", A, labels, "A = softmax(S): each row sums to 1")):
        st.caption(caption)
        st.dataframe({name: labels} | {c: M[:, j] for j, c in enumerate(cols)}, hide_index=True)

# 4. one query's weights
if T > 1:
    st.slider("Query row to read", 1, T, key=k("query"))
q = int(st.session_state[k("query")])
st.vega_lite_chart(charts.bar(A[q - 1], labels, title=f"Weights of query {q} ({tokens[q - 1]!r})"))
with recording(ran):
    entropy, gradient = entropies[q - 1], analysis.softmax_gradient_size(A)[q - 1]
st.write(f"Query {q} blends its values with {entropy:.3f} bits of entropy, "
         f"about {2 ** entropy:.2f} effective positions. The largest |∂a_i/∂s_j| of its softmax (how much a "
         f"weight moves per unit change of a score) is {gradient:.3f}: 0.25 at most, 0 for a one-hot row.")

# 5. why the scores are divided by sqrt(d_k)
st.subheader("Why divide by √d_k")
st.markdown("A score q·k adds up d_k products q_j k_j, one per feature. When the entries are "
            "independent with mean 0 and variance 1, each product has variance 1, so **var(q·k) = d_k**: "
            "the wider the head, the further apart the scores. A softmax fed scores far apart saturates: "
            "one weight near 1, the rest near 0, and its gradient ∂a_i/∂s_j = a_i(δ_ij − a_j) is near 0 "
            "in every entry, so the queries and keys behind the scores get almost nothing to learn from. "
            "Dividing by √d_k brings the variance back to 1 whatever d_k.")
with recording(ran):
    variance = analysis.dot_product_variance(Q, K)
drawn = "drawn with mean 0 and variance 1" if st.session_state[k("source")] == "random" else "as you typed them"
rule = (f" (expected: d_k = {d_k}; {T * T} pairs are a small sample)"
        if st.session_state[k("source")] == "random" else "")
st.write(f"Here (entries {drawn}, d_k = {d_k}), the {T * T} raw dot products q·k have variance "
         f"**{variance:.2f}**{rule}; divided by √d_k, **{variance / d_k:.2f}**.")

# 6. one softmax is one convex combination
st.subheader("Asking one head for two things at once")
st.markdown("A head whose query row asks for two positions gets **one** probability vector: the two "
            "positions share the weight, and the output is one blend of their values, not two values.")
if T < 3:
    st.info("Type at least three words to try this.")
else:
    qa = max(q, 3)
    with lesson_recording(ran):
        pair = heads.two_positions(T, d_k, heads.DEFAULT_GAIN, query=qa, targets=(1, qa - 1))
        _, A2 = attention(*(m.astype(dtype) for m in pair), np.eye(T, dtype=dtype), mask, backend=backend)
        row = A2[qa - 1]
        row_bits = analysis.row_entropy_bits(row)
    st.vega_lite_chart(charts.bar(row, labels, title=f"Query {qa} asks for positions 1 and {qa - 1}"))
    st.write(f"Weight on position 1: **{row[0]:.3f}**, on position {qa - 1}: **{row[qa - 2]:.3f}**, "
             f"left for the rest: {1 - row[0] - row[qa - 2]:.3f}; the row sums to {row.sum():.6f}. "
             f"Entropy {row_bits:.2f} bits, against 0 for a head that takes one position.")

st.markdown("""**What to look for.** Switching off √d_k multiplies every score by √d_k: nothing
changes at d_k = 1, and the wider the head, the further apart the scores and the lower the mean row
entropy, towards one-hot rows. A temperature below 1 sharpens the rows the same way by hand, one above
1 flattens them. The causal mask blanks the upper triangle and the weights there are exactly 0. Every
row sums to 1, so raising one weight lowers the others: asking for two positions splits the weight
between them, and the head hands back one blend of their values.""")
kernel_source(ran)
