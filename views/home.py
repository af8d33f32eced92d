"""Landing page: what the dashboard teaches, where to start, and why attention took over."""
import pandas as pd
import streamlit as st

from core.lessons import path
from core.lessons.analysis import interaction_paths
from core.recording import recording
from ui import lesson, state
from ui.real_model_parts import DEFAULT_MODEL, DESCRIBED
from ui.widgets import function_sources, source_expander

PAGE = "home"
SPEC = {"n": state.int_field(512, 2, 4096)}
state.restore(PAGE, SPEC)


def path_steps() -> None:
    """The path as rows: each page (a link), the lesson section it teaches, the claim it verifies."""
    for i, s in enumerate(path.STEPS, start=1):
        left, right = st.columns([1, 3], vertical_alignment="center")
        lesson.link(s.page, left, label=f"{i}. {s.title}")
        right.markdown(f"{s.lesson}: *{s.section}*. **Verify:** {s.claim}")


st.title("Attention, operated by hand")
st.markdown(
    """
A transformer's attention layer is a handful of matrix products and one softmax. This dashboard lets
you **set those matrices yourself** and watch what happens, computed live by small Numba kernels
(on the CPU, or on a CUDA GPU when one is present) that you can read on every page.
"""
)
st.latex(r"\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right) V")
st.header("The path")
st.markdown(
    "Each lesson page teaches one section of the lessons, says which pages to see first, and names the "
    "one claim you verify there. It opens with a question: **predict, then see**. Answer it before the "
    "control that shows the answer unlocks; a wrong answer gets a hint, a second one the answer. "
    "*Check yourself* gathers your answers (first tries count) and two exercises the app marks.")
st.graphviz_chart(path.dot())
path_steps()
st.markdown(
    f"""
Beside the path: **Check yourself** gathers your answers and marks two hands-on exercises, and
**Make it fast** times the same attention on the lesson kernel, the tuned kernel and NumPy. **A real model** opens
{DESCRIBED[DEFAULT_MODEL]}, on your own text (or {", or ".join(about for choice, about in DESCRIBED.items()
if choice != DEFAULT_MODEL)}, or a GPT-2- or BERT-family checkpoint of your choice).

The sidebar picks the backend and the precision of the lesson pages; the model pages say which
precision they run in (training runs in float32, and so does A real model). Every lesson page except
Check yourself keeps its settings in the address, so a link you copy opens exactly what you see. The
sidebar's **Notation** card defines every symbol the pages use.
"""
)

st.header("Why attention")
st.markdown(
    """
A recurrent network reads a sentence one token at a time: step t needs the state of step t − 1.
Self-attention compares every token with every other in one go, so the whole layer is a few matrix
products a GPU (or a CPU's vector units) runs at once, and any two tokens meet directly, however far
apart they are.
"""
)
n_tokens = st.slider("Tokens in the sequence", SPEC["n"].lo, SPEC["n"].hi, key=state.key(PAGE, "n"))
with recording() as ran:
    paths = interaction_paths(n_tokens)
st.dataframe(pd.DataFrame({
    "per layer": ["steps that must run one after another", "most steps between two tokens"],
    "recurrent network": [paths.rnn_sequential, paths.rnn_path],
    "self-attention": [paths.attention_sequential, paths.attention_path],
}), hide_index=True)
if sources := source_expander("The code behind this table"):
    with sources:
        function_sources(ran)
st.caption(f"The price: attention scores every pair, {n_tokens:,}² = {n_tokens ** 2:,} scores per head and "
           "layer, where a recurrent step touches each token once. Blocks of the same shape also stack "
           "easily, and decoder-only stacks trained to predict the next token at scale (GPT, LLaMA) learn "
           "representations that transfer to many tasks.")

st.subheader("Before you deploy one")
st.markdown(
    """
- **Bias amplification.** A model trained on text crawled from the web reproduces and reinforces the
  stereotypes in that text; multi-head attention has no mechanism that avoids them.
- **Memorisation.** Encoder-decoder models can reproduce training sequences word for word, private
  data such as e-mail addresses or medical notes included.
- **Environmental cost.** Training a large transformer takes a lot of energy, and serving it at scale
  keeps costing.
- **Misused cross-attention.** In models that read text and images together, cross-attention can be
  exploited to produce misleading output (caption attacks, adversarial images).
- **Maps are diagnostics, not explanations.** An attention heatmap shows where a head looked, not why
  the model decided; the page *Inside a trained model* removes a striking head and often nothing changes.
- **Position is not reasoning.** Knowing where a token sits does not give a model any sense of time,
  cause or logical order.

At a student's scale: evaluate on diverse subgroups, not only on the overall accuracy; prefer
fine-tuning a small pre-trained model to training a large one from scratch; look at the training data
before you deploy.
"""
)

state.publish(PAGE, SPEC)
