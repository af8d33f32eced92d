"""Masks and cross-attention: who may look at whom, and attention between two sequences."""
import numpy as np
import pandas as pd
import streamlit as st

from core import attention, masks, positional
from core.lessons import analysis, questions
from core.limits import MAX_HEADS, MAX_TOKENS
from ui import charts, lesson, state
from core.kernels.dispatch import lesson_recording
from ui.widgets import chosen_backend, chosen_dtype, ensure_kernels, kernel_source, tokens_from


D_MODEL = 8
PAGE = "masks"
HEAD_CHOICES = tuple(str(h) for h in (1, 2, 4, 8) if h <= MAX_HEADS)
# Every control's value, kept in the page's address so a link reopens this exact configuration.
SPEC = {"sentence": state.text_field("the tired cat sat on the warm mat"), "mask": state.bool_field(False),
        "lengths": state.text_field("6, 3, 5"), "T": state.int_field(6, 1, MAX_TOKENS),
        "heads": state.choice_field("2", HEAD_CHOICES), "causal": state.bool_field(False),
        "source": state.text_field("je suis étudiant"), "target": state.text_field("i am a student")}
k = lambda name: state.key(PAGE, name)  # noqa: E731

st.title("Masks and cross-attention")
ensure_kernels("sinusoidal", "project_heads", "attention_with_weights", "merge_heads_project")
state.restore(PAGE, SPEC)
lesson.header("masks")
unlocked = lesson.predict("masks")
ask = {p.key.split(".", 1)[1]: p for p in questions.of_page(PAGE)}
st.markdown("A mask decides which keys each query may see; cross-attention lets one sequence read "
            "another. All weights below come from our kernels, with fixed seeded inputs and weights. "
            "Positions are counted from 1.")
with st.expander("What to look for"):
    st.markdown(
        "- Turn the causal mask on: which weights vanish, and what do the rows left add up to?\n"
        "- A padded key's weight, however large its score would have been.\n"
        "- Cross-attention maps are rectangular: one row per decoder token, one column per encoder token.")


def seeded_layer(d_model: int, n_heads: int, seed: int = 0):
    """Fixed random projections ``(d, d)``: the same on every rerun."""
    rng = np.random.default_rng(seed)
    dtype = chosen_dtype()
    return [rng.normal(0.0, 1.0 / np.sqrt(d_model), (d_model, d_model)).astype(dtype) for _ in range(4)]


def embed(words, d_model: int, seed: int = 1):
    """One fixed vector per distinct word plus the sinusoidal code; ``(T, d_model)``."""
    table = {w: np.random.default_rng([seed, *map(ord, w)]).normal(size=d_model) for w in set(words)}
    PE = positional.sinusoidal(len(words), d_model, backend=chosen_backend(), dtype=chosen_dtype())
    return np.stack([table[w] for w in words]).astype(chosen_dtype()) + PE


def exactly(x: float) -> str:
    """A measured weight: "exactly 0" only when it is 0, else its value."""
    return "exactly 0" if x == 0 else f"{x:.2g}"


def row_sums_in_words(A) -> str:
    """How close every row of ``A`` comes to summing to 1, said plainly."""
    err = analysis.max_row_sum_error(A)
    return "every row sums to exactly 1" if err == 0 else f"every row sums to 1 (to within {err:.0e})"


# 1. causal ---------------------------------------------------------------------------------------
st.header("The causal mask")
st.latex(r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases} \qquad "
         r"A = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right), \qquad i, j = 1, \dots, T")
for name in ("sentence", "source", "target"):     # a link's sentence the page cannot read: named, then the default
    state.vet(PAGE, name, lambda text: tokens_from(text, max_tokens=MAX_TOKENS))
sentence = st.text_input("Sentence", key=k("sentence"))
st.caption(f"At most {MAX_TOKENS} words; one head, d_model = {D_MODEL}.")
# Shown only once the opening question is answered: the causal map is its answer.
show_causal = st.toggle("Apply the causal mask", key=k("mask"), disabled=not unlocked,
                        help=None if unlocked else "Answer the question at the top first.") and unlocked
try:
    with lesson_recording() as ran:
        words = tokens_from(sentence, max_tokens=MAX_TOKENS)
        X = embed(words, D_MODEL)
        W_Q, W_K, W_V, W_O = seeded_layer(D_MODEL, 1)
        free = attention.multi_head_attention(X, W_Q, W_K, W_V, W_O, 1, backend=chosen_backend())
        causal = attention.multi_head_attention(X, W_Q, W_K, W_V, W_O, 1, mask=masks.causal(len(words)),
                                                backend=chosen_backend()) if show_causal else None
except ValueError as err:
    st.error(str(err))
else:
    labels = charts.position_labels(words)
    if not show_causal:
        st.vega_lite_chart(charts.heatmap_grid([free.weights[0]], labels, labels, ["no mask"], columns=1, size=300))
        st.caption("Every query reads every key, the later ones included. Turn on the causal mask to hide them."
                   if unlocked else "Answer the question at the top first; then turn on the causal mask.")
    else:
        M = masks.causal(len(words))
        st.dataframe(pd.DataFrame(np.where(np.isinf(M), "−∞", "0"), index=labels, columns=labels))
        st.vega_lite_chart(charts.heatmap_grid([free.weights[0], causal.weights[0]], labels, labels,
                                            ["no mask", "causal mask"], columns=2, size=300))
        A, F = causal.weights[0], free.weights[0]
        said = (f"Measured: the largest weight above the diagonal is **{exactly(np.triu(A, 1).max())}**; "
                f"{row_sums_in_words(A)}. Query 1 may read key 1 only: its weight there is **{A[0, 0]:g}**"
                + (", so its head output is its own value vector." if A[0, 0] == 1 else "."))
        if len(words) >= 3:            # query 2 has keys after it to lose
            said += (f" Query 2 puts {F[1, :2].sum():.2f} of its weight on keys 1 and 2 without the mask and "
                     f"{A[1, :2].sum():.2f} with it: the share of the hidden keys goes to the keys it may read.")
        st.markdown(said)
    kernel_source(ran)

# 2. padding --------------------------------------------------------------------------------------
st.header("Padding masks in a batch")
st.markdown("Sequences of different lengths share one array by padding the short ones. The padding "
            "mask hides the padded keys of each sequence; it has one row per sequence and broadcasts "
            "over queries and heads.")
st.latex(r"M^{(b)}_{ij} = \begin{cases} 0 & j \le \ell_b \\ -\infty & j > \ell_b \end{cases}"
         r"\qquad i, j = 1, \dots, T;\ \ell_b \text{ the length of sequence } b")


def parse_lengths(text: str) -> list[int]:
    """The typed lengths as whole numbers; ``ValueError`` in the student's words."""
    try:
        lengths = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"Type whole numbers separated by commas, e.g. 6, 3, 5; got {text!r}.") from None
    if len(lengths) > 4:
        raise ValueError(f"This page shows at most 4 sequences; got {len(lengths)}.")
    return lengths


state.vet(PAGE, "lengths", parse_lengths)
p1, p2, p3 = st.columns(3)
typed = p1.text_input("Lengths in the batch", key=k("lengths"))
T_pad = p2.slider("Padded length T", 1, MAX_TOKENS, key=k("T"))
n_heads = int(p3.select_slider("Heads", HEAD_CHOICES, key=k("heads")))
also_causal = st.checkbox("Also causal (a decoder's batch)", key=k("causal"), disabled=not unlocked,
                          help=None if unlocked else "Answer the question at the top first.") and unlocked
try:
    lengths = parse_lengths(typed)
    pad = masks.padding(lengths, T_pad)                                   # (B, 1, T)
    mask = masks.combine(pad, masks.causal(T_pad) if also_causal else None)
    rng = np.random.default_rng(2)
    Xb = rng.normal(size=(len(lengths), T_pad, D_MODEL)).astype(chosen_dtype())   # (B, T, d)
    with lesson_recording() as ran:
        res = attention.multi_head_attention(Xb, *seeded_layer(D_MODEL, n_heads), n_heads, mask=mask,
                                             backend=chosen_backend())
except ValueError as err:
    st.error(str(err))
else:
    pos = [str(i + 1) for i in range(T_pad)]
    st.vega_lite_chart(charts.heatmap_grid([res.weights[b, 0] for b in range(len(lengths))], pos, pos,
                                        [f"sequence {b + 1}: length {n}" for b, n in enumerate(lengths)],
                                        columns=4, size=200))
    reads = (res.weights[:, 0] > 0).sum(-1)                              # (B, T): keys with weight > 0
    st.markdown(f"Weights of shape **{' × '.join(map(str, res.weights.shape))}** (sequences × heads × "
                "queries × keys). How many keys each query of head 1 reads (weight above 0):")
    st.dataframe({"keys read": [f"sequence {b + 1} (length {n})" for b, n in enumerate(lengths)]}
                 | {f"query {i + 1}": reads[:, i] for i in range(T_pad)}, hide_index=True)
    leaked = max((res.weights[b, :, :, n:].max(initial=0.0) for b, n in enumerate(lengths)), default=0.0)
    empty = [b for b, n in enumerate(lengths) if n == 0]
    st.markdown(f"Head 1 of each sequence is drawn. Measured over all heads: the largest weight on a padded "
                f"key is **{exactly(leaked)}**. Padded *queries* still produce rows (they read their "
                "sequence's real keys); a model ignores them later, in the loss or the pooling. "
                + (f"Sequence {empty[0] + 1} has length 0: its weights are "
                   + ("all 0, not NaN." if np.all(res.weights[empty[0]] == 0) else "NOT all 0.")
                   if empty else "A sequence of length 0 would get all-zero weights, not NaN: type a 0 to see it."))
    kernel_source(ran, key="sources:padding")
lesson.ask(ask["padded_keys"])

# 3. cross-attention ------------------------------------------------------------------------------
st.header("Cross-attention: the decoder reads the encoder")
# X_enc: the encoder's output (H is the number of heads on every page); Y: the decoder's stream.
st.latex(r"\mathrm{CrossAttn}(Y, X_{\text{enc}}) = \mathrm{softmax}\!\left(\frac{(Y W_Q)(X_{\text{enc}} W_K)^\top}"
         r"{\sqrt{d_k}}\right) X_{\text{enc}} W_V, \qquad A \in \mathbb{R}^{T_q \times T_k}")
st.caption("Y: the decoder's stream, one row per target token; X_enc: the encoder's output, one row per source token.")
c1, c2 = st.columns(2)
source = c1.text_input("Source (encoder side)", key=k("source"))
target = c2.text_input("Target so far (decoder side)", key=k("target"))
try:
    with lesson_recording() as ran:
        src = tokens_from(source, max_tokens=MAX_TOKENS)
        tgt = tokens_from(target, max_tokens=MAX_TOKENS)
        X_enc, Y = embed(src, D_MODEL, seed=3), embed(tgt, D_MODEL, seed=4)
        cross = attention.multi_head_attention(Y, *seeded_layer(D_MODEL, 2, seed=5), 2, X_kv=X_enc,
                                               backend=chosen_backend())
except ValueError as err:
    st.error(str(err))
else:
    st.markdown(f"Queries come from the {len(tgt)} decoder tokens, keys and values from the {len(src)} "
                f"encoder tokens: weights of shape **{cross.weights.shape[1]} × {cross.weights.shape[2]}** "
                "per head. No causal mask here: the whole source is known before decoding starts.")
    st.vega_lite_chart(charts.heatmap_grid(list(cross.weights), charts.position_labels(tgt),
                                        charts.position_labels(src), ["head 1", "head 2"], columns=2,
                                        row_title="decoder query", col_title="encoder key", size=260))
    kernel_source(ran, key="sources:cross")
lesson.ask(ask["cross_queries"])

# 4. the three families ---------------------------------------------------------------------------
st.header("Encoder-only, decoder-only, encoder-decoder")
st.table(pd.DataFrame({   # a static table: its long cells wrap instead of being cut off
    "family": ["encoder-only", "decoder-only", "encoder-decoder"],
    "attention it uses": ["self-attention, no causal mask (padding only)",
                          "causal self-attention",
                          "encoder: unmasked self-attention; decoder: causal self-attention + cross-attention"],
    "good for": ["understanding a given text: classify, tag, embed",
                 "generating text one token at a time",
                 "turning one sequence into another: translate, summarise"],
    "example": ["BERT", "GPT", "original Transformer, T5"],
}).set_index("family"))
st.markdown("Rule of thumb: read a sequence, use an encoder; write one from scratch, a decoder; rewrite "
            "one sequence as another, both, joined by cross-attention.")
lesson.ask(ask["which_architecture"])
state.publish(PAGE, SPEC)
