"""Attention, operated by hand: the dashboard's router.

Run with ``streamlit run app.py``. This file only declares the pages and the sidebar
(which backend runs the kernels, in which precision); every page lives in ``pages/``.
"""
import streamlit as st

from core import backend
from ui.widgets import BACKEND_KEY, PRECISION_KEY

st.set_page_config(page_title="Attention, operated by hand", page_icon="🔍", layout="wide")

PAGES = {
    "Start": [st.Page("pages/home.py", title="Overview", icon="🏠", default=True)],
    "Attention": [
        st.Page("pages/one_head.py", title="One head", icon="🎯"),
        st.Page("pages/multi_head.py", title="Multi-head, set by hand", icon="🧩"),
        st.Page("pages/filter_bank.py", title="Concat, W_O and the filter bank", icon="🎛️"),
    ],
    "Around attention": [
        st.Page("pages/parameters.py", title="Parameters and cost", icon="🧮"),
        st.Page("pages/positional.py", title="Positional encoding", icon="📍"),
        st.Page("pages/masks.py", title="Masks and cross-attention", icon="🎭"),
    ],
    "Practice": [
        st.Page("pages/training.py", title="Train an encoder", icon="🏋️"),
        st.Page("pages/inside_model.py", title="Inside a trained model", icon="🔬"),
        st.Page("pages/decoder.py", title="Decoder and generation", icon="✍️"),
        st.Page("pages/induction.py", title="Induction heads", icon="🔁"),
        st.Page("pages/check_yourself.py", title="Check yourself", icon="✅"),
    ],
    "Under the hood": [st.Page("pages/make_it_fast.py", title="Make it fast", icon="🚀")],
}

with st.sidebar:
    st.selectbox("Backend", backend.CHOICES, key=BACKEND_KEY,
                 help="Where the Numba kernels run. auto = a CUDA GPU when one is present, else the CPU.")
    st.radio("Precision", ["float64", "float32"], key=PRECISION_KEY, horizontal=True,
             help="float64 shows the lesson's identities to ~1e-15; float32 is what fast models use.")
    choice = st.session_state.get(BACKEND_KEY, "auto")
    description = backend.describe(None if choice == "auto" else choice)
    if description.startswith("unavailable"):
        st.error(description)
    else:
        st.caption(f"Running on: {description}")

# expanded: every page stays a link (the default folds all past the tenth under "View more").
st.navigation(PAGES, expanded=True).run()
