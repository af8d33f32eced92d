"""Check yourself: every page's questions gathered with how each was answered, and two exercises the app marks by running them."""
import numpy as np
import streamlit as st

from core.lessons import analysis, exercises, heads, path, predictions, questions
from core.limits import MAX_MATRIX_ENTRY
from ui import charts, lesson
from ui.state import matrix_input
from core.kernels.dispatch import lesson_recording
from ui.widgets import chosen_backend, ensure_kernels, kernel_source


STATUS = {None: "not answered yet", "hint": "hint given, not answered yet"}


def status(p: predictions.Progress) -> str:
    """How a question stands, in words."""
    if not p.done:
        return STATUS[p.last if p.tries else None]
    if p.first_try_right:
        return "✅ right at the first try"
    return "right at the second try" if p.last == predictions.RIGHT else "answer shown after two tries"


def answers_by_page(progress) -> None:
    """Each page on the path (a link that keeps this session) and how each of its questions stands."""
    for s in path.STEPS:
        lesson.link(s.page, label=f"{s.title}")
        st.markdown("\n".join(f"- {status(progress[q.key])} · {q.prompt}" for q in questions.of_page(s.page)))


st.title("Check yourself")
ensure_kernels("attention_with_weights")
st.markdown("Every lesson page asks you to predict before it shows. Here are your answers so far (only "
            "first tries count), then two exercises the app marks by running your settings through the same "
            "kernels as the other pages.")

VERDICTS = "cy_verdicts"   # {exercise key: (the answer it judged, its Check)}, for the whole visit
verdicts = st.session_state.setdefault(VERDICTS, {})


def marked(key: str, answer, check, *, button: str = "Check") -> None:
    """A Check button and, below it, the verdict on ``answer`` while that answer stands.

    A verdict stays when the other exercise is answered; changing this answer clears it, since it
    judged the old one. ``check`` computes the verdict (a :class:`exercises.Check`) when pressed.
    """
    if st.button(button, key=f"cy_{key}_check"):
        verdicts[key] = (answer, check())
    elif key in verdicts and not _same(verdicts[key][0], answer):
        del verdicts[key]
    if key in verdicts:
        result = verdicts[key][1]
        (st.success if result.ok else st.warning)(result.explanation)


def _same(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else a == b


# 1. the pages' questions, gathered -------------------------------------------------------------
st.header("Your answers, page by page")
everything = questions.everything()
progress = {q.key: lesson.progress_of(q.key) for q in everything}
right, tried = predictions.score(progress.values())
m1, m2, m3 = st.columns(3)
exercise_box = m3.empty()    # filled at the end, once both exercises' verdicts of this run are known
m1.metric("Right at the first try", f"{right} of {tried}" if tried else "nothing answered yet",
          help="Only a question's first answer counts; a hint or a shown answer does not change it.")
m2.metric("Questions answered", f"{sum(p.done for p in progress.values())} of {len(everything)}")
answers_by_page(progress)
st.caption("Open a page by its link to answer its questions; your answers last as long as this browser tab.")

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
m1, m2, m3 = st.columns(3)
exercise_box = m3.empty()    # filled at the end, once both exercises' verdicts of this run are known
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
    kernel_source(ran, key="sources:two")

passed, checked = exercises.score({k: v[1] for k, v in verdicts.items()})
exercise_box.metric("Exercises passed", f"{passed} of 2", help=f"Checked so far: {checked} of 2. A verdict stays "
                    "until you change that answer.")

# the lesson's own solution, for after an attempt
if st.checkbox("Show a worked solution", key="cy_two_solution"):
    Qs, Ks = heads.two_positions(T2, d_k, 3.0)
    st.markdown("Keys 1 and 3 carry a marker 3 in feature f1, and only query 4 asks for it (1 in f1):")
    st.code(f"Q =\n{Qs}\nK =\n{Ks}")
