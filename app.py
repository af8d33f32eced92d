"""Attention, operated by hand: the dashboard's router.

Run with ``streamlit run app.py``. This file only declares the pages and the sidebar
(which backend runs the kernels, in which precision); every page lives in ``views/`` (not ``pages/``: Streamlit would list a ``pages/`` folder by its file names on a fresh server).
"""
import streamlit as st

from core import backend, warmup
from ui import redraw_log
from ui.lesson import notation_card
from ui.widgets import BACKEND_KEY, PRECISION_KEY

# Material icons, not emoji: an emoji icon makes Streamlit load its emoji catalogue, a tenth of a
# second of a fresh server's first visit
st.set_page_config(page_title="Attention, operated by hand", page_icon=":material/search:", layout="wide")
warmup.start_once(after_a_page=True)   # once per server process: the kernels compile in the background, after the first page

# The sidebar lists the lesson pages in the order of the path (core/lessons/path.py): each page's
# prerequisites come before it.
PAGES = {
    "Start": [st.Page("views/home.py", title="Overview", icon=":material/home:", default=True)],
    "Attention": [
        st.Page("views/one_head.py", title="One head", icon=":material/adjust:"),
        st.Page("views/positional.py", title="Positional encoding", icon=":material/location_on:"),
        st.Page("views/multi_head.py", title="Multi-head, set by hand", icon=":material/extension:"),
        st.Page("views/filter_bank.py", title="Concat, W_O and the filter bank", icon=":material/tune:"),
    ],
    "Around attention": [
        st.Page("views/parameters.py", title="Parameters and cost", icon=":material/calculate:"),
        st.Page("views/masks.py", title="Masks and cross-attention", icon=":material/theater_comedy:"),
    ],
    "Practice": [
        st.Page("views/training.py", title="Train an encoder", icon=":material/fitness_center:"),
        st.Page("views/inside_model.py", title="Inside a trained model", icon=":material/biotech:"),
        st.Page("views/decoder.py", title="Decoder and generation", icon=":material/edit_note:"),
        st.Page("views/induction.py", title="Induction heads", icon=":material/repeat:"),
        st.Page("views/real_model.py", title="A real model", icon=":material/smart_toy:"),
        st.Page("views/check_yourself.py", title="Check yourself", icon=":material/check_circle:"),
    ],
    "Under the hood": [st.Page("views/make_it_fast.py", title="Make it fast", icon=":material/rocket_launch:")],
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
    notation_card()

# expanded: every page stays a link (the default folds all past the tenth under "View more").
page = st.navigation(PAGES, expanded=True)
with redraw_log.timed(page.url_path or "home"), warmup.start_once().page_running():   # the warm-up waits for it
    page.run()
