"""Check yourself: questions with explanations, and exercises the app marks by running them."""
import numpy as np
import streamlit as st

from core.lessons import analysis
from core.lessons import exercises
from core.lessons import heads
from core.limits import MAX_MATRIX_ENTRY
from ui import charts
from ui.state import matrix_input
from core.kernels.dispatch import lesson_recording
from ui.widgets import chosen_backend, ensure_kernels, kernel_source


st.title("Check yourself")
ensure_kernels("attention_with_weights")
st.markdown("Answer, then press **Check**: the app marks the answer and says why. The exercises at the "
            "bottom are marked by running your settings through the same kernels as the other pages.")
with st.expander("What to look for"):
    st.markdown("Read the explanation even when you are right: each one points to the page where you can "
                "see the fact for yourself.")


VERDICTS = "cy_verdicts"   # {question key: (the answer it judged, its Check)}, for the whole visit
verdicts = st.session_state.setdefault(VERDICTS, {})
score_box = st.container()   # filled at the end, once every verdict of this run is known


def marked(key: str, answer, check, *, button: str = "Check") -> None:
    """A Check button and, below it, the verdict on ``answer`` while that answer stands.

    A verdict stays when other questions are answered; changing this answer clears it, since it
    judged the old one. ``check`` computes the verdict (a :class:`exercises.Check`) when pressed.
    """
    if st.button(button, key=f"cy_{key}_check"):
        verdicts[key] = (answer, check())
    elif key in verdicts and not _same(verdicts[key][0], answer):
        del verdicts[key]
    if key in verdicts:
        result = verdicts[key][1]
        (st.success if result.ok else st.warning)(result.explanation)


def _blank(answer) -> bool:
    return isinstance(answer, str) and not answer.strip()


def _same(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else a == b


# 1. multiple choice -----------------------------------------------------------------------------
st.header("Questions")
for n, q in enumerate(exercises.QUESTIONS, start=1):
    st.markdown(f"**Q{n}.** {q.prompt}")
    choice = st.radio(f"Q{n}", q.options, index=None, key=f"cy_{q.key}", label_visibility="collapsed")
    marked(q.key, choice, lambda: exercises.check_choice(q.key, choice))

st.header("Count it")
for n, q in enumerate(exercises.NUMERIC_QUESTIONS, start=1):
    typed = st.text_input(f"N{n}. {q.prompt}", key=f"cy_{q.key}", placeholder="a whole number, e.g. 1,048,576")
    marked(q.key, typed, lambda: exercises.check_number(q.key, typed))
st.caption("The Parameters and cost page computes these counts if you want to try sizes of your own.")

# 2. a sharper first-token head -----------------------------------------------------------------
st.header("Exercise: a sharper first-token head")
st.markdown(f"The first-token head marks key 1 with strength *gain*; every query asks for that mark. Find a "
            f"gain at which row {exercises.FIRST_TOKEN_T} blends fewer than "
            f"**{exercises.FIRST_TOKEN_TARGET}** effective positions (causal mask, d_k = {exercises.FIRST_TOKEN_D_K}).")
st.latex(r"H_t = -\sum_i A_{ti}\log_2 A_{ti}, \qquad \text{effective positions} = 2^{H_t}, \qquad "
         r"\text{score}(t, 1) = \frac{\text{gain}}{\sqrt{d_k}}")
gain = st.slider("gain", -20.0, 20.0, 3.0, step=0.1, key="cy_gain")
with lesson_recording() as ran:
    A = exercises.first_token_weights(gain, backend=chosen_backend())
T = exercises.FIRST_TOKEN_T
labels = [str(i + 1) for i in range(T)]
left, right = st.columns([1, 1])
left.vega_lite_chart(charts.heatmap(A, labels, labels, title=f"first-token head, gain {gain:g}"))
right.vega_lite_chart(charts.bar(analysis.effective_positions(A), labels, title="effective positions 2^H per row",
                              x_title="query t", y_title="2^H", y_domain=(0, T)), width="stretch")
m1, m2 = st.columns(2)
m1.metric(f"Row {T}: weight on token 1", f"{A[T - 1, 0]:.4f}")
m2.metric(f"Row {T}: effective positions 2^H", f"{analysis.effective_positions(A)[T - 1]:.4f}")
marked("gain", gain, lambda: exercises.check_first_token_gain(gain, backend=chosen_backend()), button="Check my gain")
kernel_source(ran)

# 3. two places at once -------------------------------------------------------------------------
st.header("Exercise: one row, two places")
T2, d_k = exercises.TWO_POSITION_T, exercises.TWO_POSITION_D_K
st.markdown(f"Type queries Q and keys K ({T2} positions × d_k = {d_k}) so that, under a causal mask, **row 4** "
            "puts roughly equal weight on positions **1 and 3** and almost none on **2 and 4**. "
            f"Cells are numbers with |x| ≤ {MAX_MATRIX_ENTRY:g}.")
pos = [f"t{i + 1}" for i in range(T2)]
cols = [f"f{j + 1}" for j in range(d_k)]
c1, c2 = st.columns(2)
with c1:
    st.markdown("**Q** (one row per query)")
    Q = matrix_input("check_yourself", "Q", np.zeros((T2, d_k)), pos, cols, label="Q", limit=MAX_MATRIX_ENTRY)
with c2:
    st.markdown("**K** (one row per key)")
    K = matrix_input("check_yourself", "K", np.zeros((T2, d_k)), pos, cols, label="K", limit=MAX_MATRIX_ENTRY)
with st.expander("Hint"):
    st.markdown("Softmax gives equal scores equal weights. What could keys 1 and 3 have in common that "
                "keys 2 and 4 lack, and what should query 4 ask for?")
try:
    with lesson_recording() as ran:
        result = exercises.check_two_position_head(Q, K, backend=chosen_backend())
except ValueError as err:
    st.error(str(err))
else:
    st.vega_lite_chart(charts.heatmap(result.weights, pos, pos, title="your head's weights (causal)"))
    st.vega_lite_chart(charts.stem(result.weights[3], title="row 4: the impulse response"), width="stretch")
    marked("two", np.stack([Q, K]), lambda: result, button="Check my head")
    kernel_source(ran)

# the running score, at the top of the page
right, checked = exercises.score({k: v[1] for k, v in verdicts.items() if v[0] is not None and not _blank(v[0])})
with score_box:
    total = len(exercises.QUESTIONS) + len(exercises.NUMERIC_QUESTIONS) + 2
    st.metric("Score so far", f"{right} of {checked} checked" if checked else "nothing checked yet",
              help=f"Answers marked right, out of those you have checked ({total} on this page). "
                   "A verdict stays until you change that answer.")

# the lesson's own solution, for after an attempt
if st.checkbox("Show a worked solution", key="cy_two_solution"):
    Qs, Ks = heads.two_positions(T2, d_k, 3.0)
    st.markdown("Keys 1 and 3 carry a marker 3 in feature f1, and only query 4 asks for it (1 in f1):")
    st.code(f"Q =\n{Qs}\nK =\n{Ks}")
