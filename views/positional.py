"""Positional encoding: why attention needs it, the sinusoidal code, and other ways to tell position."""
import numpy as np
import pandas as pd
import streamlit as st

from core import masks, positional
from core.lessons import positions, questions, relative_positions
from core.limits import MAX_D_MODEL, MAX_PE_POSITIONS, MAX_TOKENS
from ui import charts, lesson, state
from core.kernels.dispatch import lesson_recording
from ui.widgets import chosen_backend, chosen_dtype, ensure_kernels, kernel_source, tokens_from


DRAW_POSITIONS = 128   # heatmaps draw at most this many positions (the numbers use all of them)
DRAW_DIMS = 64
PAGE = "positional"
# Every control's value, kept in the page's address so a link reopens this exact configuration.
SPEC = {"a": state.text_field("dog bites man"), "b": state.text_field("man bites dog"),
        "T": state.int_field(50, 2, MAX_PE_POSITIONS), "d": state.int_field(128, 2, MAX_D_MODEL),
        "base": state.float_field(10000.0, 2.0, 1e6), "from": state.int_field(0, 0, MAX_PE_POSITIONS - 1),
        "k": state.int_field(5, 1, MAX_PE_POSITIONS - 1), "Tc": state.int_field(100, 16, MAX_PE_POSITIONS),
        "Ts": state.int_field(8, 4, MAX_TOKENS), "trained": state.int_field(512, 1, MAX_PE_POSITIONS),
        "asked": state.int_field(1024, 1, 2 * MAX_PE_POSITIONS)}
key = lambda name: state.key(PAGE, name)  # noqa: E731
SHUFFLES = key("shuffles")     # how many times B was shuffled: the seed of the next shuffle


def shuffle_into_b() -> None:
    """Sentence B := sentence A's words in another (seeded) order."""
    try:
        words = tokens_from(st.session_state[key("a")], max_tokens=MAX_TOKENS)
    except ValueError:
        return                                        # the page names what is wrong with A
    st.session_state[SHUFFLES] = st.session_state.get(SHUFFLES, 0) + 1
    shown = st.session_state[key("b")].split()
    st.session_state[key("b")] = " ".join(positions.shuffled(words, seed=st.session_state[SHUFFLES], unlike=shown))

st.title("Positional encoding")
ensure_kernels("sinusoidal", "project_heads", "attention_with_weights", "merge_heads_project")
state.restore(PAGE, SPEC)
if st.session_state[key("d")] % 2:                                 # the d_model slider moves in steps of 2
    state.settle(PAGE, "d", st.session_state[key("d")] - 1, "d_model is even here (sine and cosine in pairs).")
lesson.header("positional")
unlocked = lesson.predict("positional")
st.markdown("Attention compares every token with every other. Does it know *where* each token sits? "
            "This page measures it, then looks at the codes that add position.")
with st.expander("What to look for"):
    st.markdown(
        "- Reorder the words of a sentence, and compare the outputs without and with positions.\n"
        "- In the sinusoidal code, the left columns spin fast and the right ones slowly; together they "
        "fingerprint each position.\n"
        "- PE_p · PE_(p+k) is one number for every p: the code carries the offset k on its own.\n"
        "- With a tiny d_model, far-apart positions get nearly the same code.\n"
        "- RoPE and ALiBi put position into the scores instead of the inputs.")

# 1. order blindness ------------------------------------------------------------------------------
st.header("Does attention see the order of the words?")
st.latex(r"O = \mathrm{MHA}(E + P), \qquad E = \text{the words' embeddings}, \qquad "
         r"P = 0 \text{ (no positions) or } PE \text{ (the sinusoidal code below)}")
for name in ("a", "b"):
    state.vet(PAGE, name, lambda text: tokens_from(text, max_tokens=MAX_TOKENS))
c1, c2, c3 = st.columns([3, 3, 2], vertical_alignment="bottom")
sentence_a = c1.text_input("Sentence A", key=key("a"), disabled=not unlocked)
sentence_b = c2.text_input("Sentence B (the same words, reordered)", key=key("b"), disabled=not unlocked)
c3.button("Shuffle A's words into B", on_click=shuffle_into_b, disabled=not unlocked)
st.caption(f"At most {MAX_TOKENS} words. One layer: d_model = 8, 2 heads, fixed seeded embeddings and weights.")
plain = None
try:
    with lesson_recording() as ran:
        words_a = tokens_from(sentence_a, max_tokens=MAX_TOKENS)
        words_b = tokens_from(sentence_b, max_tokens=MAX_TOKENS)
        plain = positions.order_blindness(words_a, words_b, with_pe=False, backend=chosen_backend(),
                                           dtype=chosen_dtype())
        coded = positions.order_blindness(words_a, words_b, with_pe=True, backend=chosen_backend(),
                                           dtype=chosen_dtype())
except ValueError as err:
    st.error(str(err))
if plain is not None and not unlocked:
    st.info("The outputs appear once you have answered the question at the top.")
elif plain is not None:
    st.latex(r"\text{gap} = \max\,\bigl|O_B - \Pi\,O_A\bigr|, \qquad \Pi = \text{the reordering of the words}")
    m1, m2 = st.columns(2)
    m1.metric("gap without PE", f"{plain.gap:.2e}",
              help="Rounding level: B's outputs are A's outputs, reordered.")
    m2.metric("gap with sinusoidal PE", f"{coded.gap:.2e}")
    st.markdown(f"Without positions the outputs are **{'a permutation' if plain.is_permutation else 'not a permutation'}** "
                f"of each other; with positions they are **{'a permutation' if coded.is_permutation else 'different'}**.")
    dims = [f"d{i + 1}" for i in range(plain.outputs_a.shape[1])]
    for res, name in ((plain, "without PE"), (coded, "with PE")):
        st.vega_lite_chart(charts.heatmap_grid(
            [res.outputs_a[res.permutation], res.outputs_b], charts.position_labels(words_b), dims,
            [f"A's outputs, in B's order ({name})", f"B's outputs ({name})"], kind="signed",
            value_name="output", columns=2, row_title="token", col_title="feature"))
    kernel_source(ran)
lesson.ask(questions.by_key("positional.no_positions"))

# 2. the sinusoidal code ---------------------------------------------------------------------------
st.header("The sinusoidal code")
st.latex(r"PE_{p,\,2i} = \sin(p\,\omega_i), \qquad PE_{p,\,2i+1} = \cos(p\,\omega_i), \qquad "
         r"\omega_i = \frac{1}{b^{2i/d_{\text{model}}}}, \qquad b = 10000 \text{ (the base, set below)}")
s1, s2, s3 = st.columns(3)
T = s1.slider("Positions T", 2, MAX_PE_POSITIONS, key=key("T"))
d_model = s2.slider("d_model", 2, MAX_D_MODEL, step=2, key=key("d"))
base = state.decimal_number_input(s3, "Base b", 2.0, 1e6, key=key("base"), step=0.01)
st.caption(f"Caps: T ≤ {MAX_PE_POSITIONS}, d_model ≤ {MAX_D_MODEL}; heatmaps draw the first "
           f"{DRAW_POSITIONS} positions and {DRAW_DIMS} dimensions.")
omega = positions.frequencies(d_model, base)
if len(omega) == 1:
    turns = f"Its one pair of columns (i = 0) turns at ω_0 = {omega[0]:g} radian per position."
else:
    turns = (f"Column pair i = 0 … {len(omega) - 1} turns at ω_i radians per position: from ω_0 = {omega[0]:g} "
             f"down to ω_{len(omega) - 1} = {omega[-1]:.3g}.")
st.markdown(f"Position p counts from 0 in this formula. {turns}")
try:
    with lesson_recording() as ran:
        PE = positional.sinusoidal(T, d_model, base, backend=chosen_backend(), dtype=chosen_dtype())
except ValueError as err:
    st.error(str(err))
    st.stop()
shown = PE[:DRAW_POSITIONS, :DRAW_DIMS]
pos_labels = [str(p) for p in range(shown.shape[0])]
left, right = st.columns(2)
left.vega_lite_chart(charts.heatmap(shown, pos_labels, [str(i) for i in range(shown.shape[1])],
                                 title="PE (positions × dimensions)", kind="signed", value_name="PE",
                                 row_title="position", col_title="dimension", size=360, annotate=False))
C = positions.cosine_similarity_matrix(PE)
right.vega_lite_chart(charts.heatmap(C[:DRAW_POSITIONS, :DRAW_POSITIONS], pos_labels, pos_labels,
                                  title="cosine similarity between positions", kind="signed",
                                  value_name="cosine", row_title="position", col_title="position",
                                  size=360, annotate=False))
kernel_source(ran, key="sources:similarity")

if st.session_state[key("from")] > T - 1:                                 # within this T
    state.settle(PAGE, "from", T - 1, f"with {T} positions the last one is {T - 1}.")
origin = st.slider("Similarity from position", 0, T - 1, key=key("from"))
curve = pd.DataFrame({"position": np.arange(T), "cosine": positions.similarity_from(PE, origin)})
st.vega_lite_chart(charts.lines(curve, "position", "cosine", title=f"cosine similarity to position {origin}",
                             y_domain=(-1, 1)), width="stretch")
with st.expander(f"Cosine similarity to position {origin}, as numbers"):
    st.dataframe(curve, hide_index=True)

st.subheader("The dot product depends only on the offset")
st.latex(r"PE_p \cdot PE_{p+k} = \sum_i \bigl[\sin(p\omega_i)\sin((p{+}k)\omega_i) + "
         r"\cos(p\omega_i)\cos((p{+}k)\omega_i)\bigr] = \sum_i \cos(k\,\omega_i), \qquad "
         r"\omega_i = 1/b^{2i/d_{\text{model}}}")
if st.session_state[key("k")] > T - 1:
    state.settle(PAGE, "k", T - 1, f"with {T} positions the largest offset is {T - 1}.")
if T > 2:
    k = st.slider("Offset k", 1, T - 1, key=key("k"))
else:  # a slider needs two values to choose from
    k = 1
    st.caption("Offset k = 1 (the only offset two positions allow).")
learned = positions.learned(T, d_model, seed=0)
sin_dots = positions.offset_dot_products(PE, k)
learned_dots = positions.offset_dot_products(learned, k)
frame = pd.concat([  # each divided by its mean squared norm, so both are on one scale
    pd.DataFrame({"p": np.arange(len(sin_dots)), "dot": sin_dots / np.mean((PE ** 2).sum(1)), "code": "sinusoidal"}),
    pd.DataFrame({"p": np.arange(len(learned_dots)), "dot": learned_dots / np.mean((learned ** 2).sum(1)),
                  "code": "learned (random init)"})])
st.vega_lite_chart(charts.lines(frame, "p", "dot", color="code", title=f"PE_p · PE_(p+{k}) / mean |PE|², for every p", y_title="normalised dot product"),
                width="stretch")
st.markdown(f"Sinusoidal: every p gives {sin_dots.mean():.6f}; spread max − min = **{np.ptp(sin_dots):.1e}**. "
            f"A random (untrained, learned-style) code: spread {np.ptp(learned_dots):.1e} on values of "
            f"size {np.abs(learned_dots).max():.1e}, no such rule.")

st.subheader("Too narrow a code: positions that nearly collide")
T_c = st.slider("Positions searched", 16, MAX_PE_POSITIONS, key=key("Tc"))
widths = [2, 4, 8, 16, 32, 64]
pairs = positions.collisions_by_width(T_c, widths, base, backend=chosen_backend())
st.dataframe(pd.DataFrame({
    "d_model": widths, "closest pair": [f"{p.i} and {p.j}" for p in pairs], "apart": [p.j - p.i for p in pairs],
    "distance": [p.distance for p in pairs], "typical |PE|": [p.typical_norm for p in pairs],
    "cosine": [p.cosine for p in pairs]}), hide_index=True)
st.markdown("Where *apart* is 1, the nearest code to a position is its neighbour's: fine. Where it is "
            "large, two distant positions get nearly the same code.")
closest = positions.worst_collision(pairs, widths, base)
if closest is None:
    st.markdown(f"Here every width's closest pair is a pair of neighbours: among the first {T_c} positions "
                "no two distant positions come close.")
else:
    p = closest.pair
    st.markdown(f"The closest call here: at d_model = {closest.d_model}, positions {p.i} and {p.j}, "
                f"{p.j - p.i} apart, have codes only **{p.distance:.3g}** apart (cosine {p.cosine:.5f}), where "
                f"two neighbouring positions' codes are {closest.neighbour_distance:.3g} apart: "
                f"**{closest.times_closer:.0f} times closer**. A model can still tell them apart, but only "
                "from a difference that small.")

st.subheader("Longer than training: learned positions stop, sinusoids go on")
st.markdown("A learned table has one row per position it was trained on. Ask a table trained at 512 "
            "positions for 1024 and half the rows do not exist; the sinusoidal code is a formula of p and "
            "gives every row.")
l1, l2 = st.columns(2)
trained = state.whole_number_input(l1, f"Positions the learned table was trained on (at most {MAX_PE_POSITIONS})",
                                   1, MAX_PE_POSITIONS, key=key("trained"))
asked = state.whole_number_input(l2, f"Positions asked for (at most {2 * MAX_PE_POSITIONS})", 1,
                                 2 * MAX_PE_POSITIONS, key=key("asked"))
with lesson_recording() as ran:
    longer = positions.longer_than_trained(int(trained), int(asked), d_model, base, backend=chosen_backend(),
                                            dtype=chosen_dtype())
last = int(asked) - 1


def norm_or_missing(row) -> str:
    """The length of a position's vector, or a plain word when the table has no such row."""
    return f"{np.linalg.norm(row):.4f}" if np.isfinite(row).all() else "no such row"


st.dataframe(pd.DataFrame({
    "code": [f"learned (trained at {int(trained)})", "sinusoidal (formula)"],
    "positions asked": [int(asked)] * 2,
    "rows it has": [int(asked) - longer.missing, int(np.isfinite(longer.sinusoidal_rows).all(axis=1).sum())],
    "missing rows": [longer.missing, int((~np.isfinite(longer.sinusoidal_rows)).all(axis=1).sum())],
    f"|vector of position {last}|": [norm_or_missing(longer.learned_rows[last]),
                                     norm_or_missing(longer.sinusoidal_rows[last])]}), hide_index=True)
if longer.message:
    st.markdown(f"**Looking up the learned table:** {longer.message}")
else:
    st.markdown(f"**Looking up the learned table:** all {int(asked)} positions are within its {int(trained)} rows.")
lo = max(0, int(trained) - 8)
hi = min(int(asked), lo + 16)
strip = [str(p) for p in range(lo, hi)]
dims = [str(i) for i in range(min(16, d_model))]
st.vega_lite_chart(charts.heatmap_grid(
    [longer.learned_rows[lo:hi, :len(dims)], longer.sinusoidal_rows[lo:hi, :len(dims)]], strip, dims,
    [f"learned: rows {lo}–{hi - 1} (blank: no row)", f"sinusoidal: rows {lo}–{hi - 1}"], kind="signed",
    value_name="PE", columns=2, row_title="position", col_title="dimension", size=220, annotate=False))
st.caption("The sinusoidal rows exist, but that is not the same as working: a model trained on sequences of "
           "length ≤ 512 has never seen the codes of positions 512–1023 next to its data, and may behave "
           "unexpectedly there. That is one reason practitioners cap sequence lengths or move to relative "
           "schemes such as RoPE and ALiBi (below).")
kernel_source(ran, key="sources:learned")

# 3. other ways to tell position -----------------------------------------------------------------
st.header("Other codes, seen in the scores")
T_s = st.slider("Positions for the score maps", 4, MAX_TOKENS, key=key("Ts"))
labels = [str(p) for p in range(T_s)]
P_sin = positional.sinusoidal(T_s, d_model, base, backend=chosen_backend())
P_learned = positions.learned(T_s, d_model, seed=0)
itself, other = positions.self_and_other_scores(P_learned)
stands = "stands out" if itself >= 3 * other else "barely stands out at this small d_model"
st.markdown("**Learned positions** (BERT): one trainable vector per position. Before training they are "
            "random draws (each entry from N(0, 0.02²)), so the only pattern in the position-only scores "
            f"P Pᵀ/√d is the diagonal, where each vector meets itself, and it {stands}: |P_p|²/√d averages "
            f"**{itself:.1e}** there, against **{other:.1e}** in size between two different positions "
            f"({itself / other:.1f} times less). Off the diagonal the signs are random: drawn independently, "
            "neighbouring positions are no more alike than distant ones until training makes them so. A "
            "position beyond the table has no vector at all.")
st.vega_lite_chart(charts.heatmap_grid([P_sin @ P_sin.T / np.sqrt(d_model), P_learned @ P_learned.T / np.sqrt(d_model)],
                                    labels, labels, ["sinusoidal: P Pᵀ/√d", "learned (random init): P Pᵀ/√d"],
                                    kind="signed", value_name="score", columns=2))
st.markdown("**RoPE** rotates each pair of query and key features by an angle proportional to the "
            "position, so the score sees only the offset n − m: with the same content at every position, "
            "each diagonal is constant. SmolLM2 (on *A real model*) turns its queries and keys this way, with "
            "base 100,000 and in the rotate-half layout of Llama: feature c of a head is paired with feature "
            "c + d_k/2, not with its neighbour as in the map below (features 2i and 2i + 1), which changes which "
            "features turn together but not that only n − m counts.")
st.latex(r"S_{mn} = \bigl(R(m)\,q_m\bigr)\cdot\bigl(R(n)\,k_n\bigr) = q_m \cdot R(n-m)\,k_n")
rng = np.random.default_rng(0)
d_rope = 8
q, kk = rng.normal(size=d_rope), rng.normal(size=d_rope)
S_rope = relative_positions.rope_scores(np.tile(q, (T_s, 1)), np.tile(kk, (T_s, 1)), base=base)
st.vega_lite_chart(charts.heatmap(S_rope, labels, labels, title="RoPE scores, same q and k everywhere",
                               kind="signed", value_name="score"))
with st.expander("RoPE scores as numbers (rows: query position m; columns: key position n)"):
    st.dataframe({"RoPE S": labels} | {n: S_rope[:, j] for j, n in enumerate(labels)}, hide_index=True)
st.markdown("**ALiBi** adds no code to the inputs; each head subtracts a penalty proportional to distance, "
            "with its own slope (steep heads look near, shallow heads far).")
st.latex(r"S^{(h)}_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_k}} - m_h\,|i-j|, \qquad m_h = 2^{-8h/H}")
H_alibi = 4
S_alibi = relative_positions.alibi_scores(np.zeros((T_s, 2)), np.zeros((T_s, 2)), H_alibi) + masks.causal(T_s)
st.vega_lite_chart(charts.heatmap_grid([np.where(np.isinf(S), np.nan, S) for S in S_alibi], labels, labels,
                                    [f"head {h + 1}: slope {m:.3f}" for h, m in enumerate(relative_positions.alibi_slopes(H_alibi))],
                                    kind="signed", value_name="score", columns=2, size=180))
st.caption("ALiBi maps use Q = K = 0 under a causal mask, so what you see is the bias alone; masked cells are blank.")
state.publish(PAGE, SPEC)
