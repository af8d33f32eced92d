"""Landing page: what the dashboard teaches and where to start."""
import streamlit as st

from ui.router import ensure_routed

ensure_routed()   # a link opened first on a fresh server: rerun through app.py

st.title("Attention, operated by hand")
st.markdown(
    """
A transformer's attention layer is a handful of matrix products and one softmax. This dashboard lets
you **set those matrices yourself** and watch what happens, computed live by small Numba kernels
(on the CPU, or on a CUDA GPU when one is present) that you can read on every page.
"""
)
st.latex(r"\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right) V")
st.markdown(
    """
**Where to go**

| Page | What you do there |
|---|---|
| One head | type a sentence, set queries and keys, watch one softmax blend the values |
| Multi-head, set by hand | give each head a job (first token, previous token, self, uniform, two places at once) |
| Concat, W_O and the filter bank | take the output apart, head by head, and check that the pieces add up |
| Parameters and cost | count weights: `4·d_model²` for attention, whatever the number of heads |
| Positional encoding | see why attention alone is blind to word order, and the fixes |
| Masks and cross-attention | causal, padding, and decoder-over-encoder attention |
| Train an encoder | train a tiny transformer live and watch its heads form |
| Check yourself | questions and hands-on exercises the app checks for you |

The sidebar picks the backend and the precision. The three attention pages and the training page
keep their settings in the address, so a link you copy opens exactly what you see.
"""
)
