"""Make every page run through the router (``app.py``), even when opened first from a link.

Streamlit keeps an older way of building a multipage app: when the main script sits beside a
``pages/`` folder, it lists that folder's files itself and runs the page a URL names *without
running the main script*. That mode is on when a server starts and stays on until some session's
script calls ``st.navigation``. So the first visitor of a fresh server who opens a shared link
(``/one_head?seed=3``) instead of ``/`` gets a page without ``app.py``: the sidebar lists raw file
names, the backend and precision controls are missing and ``st.set_page_config`` never ran. Every
later visitor gets the same until someone opens ``/``.

Each page file calls :func:`ensure_routed` right after its imports. When the page was started by
that older mode, it switches the mode off (as ``st.navigation`` itself does) and asks for a rerun:
the rerun keeps the page and its query string, and this time ``app.py`` routes it.

This reads two pieces of Streamlit's internals, checked by the browser test that opens a deep
link first on a freshly started server (``tests/test_browser.py``):

- ``PagesManager.uses_pages_directory``, the class-wide switch of the older mode, which
  ``st.navigation`` sets to False (``streamlit/commands/navigation.py``);
- the pages registered for the current run: the older mode registers the main script itself as
  the default page (``_mpa_v1`` in ``streamlit/runtime/scriptrunner/script_runner.py``), which the
  router's own ``st.navigation`` never does.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st


def started_without_router() -> bool:
    """True when this script run is a page started by Streamlit's pages-folder mode, not by ``app.py``.

    The sign: the main script (``app.py``) is one of the registered pages while another file is
    running. ``app.py``'s ``st.navigation`` never lists ``app.py``; and a page run on its own (as
    ``AppTest`` runs it) *is* the main script, so it is left alone.
    """
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:                     # imported outside a Streamlit run (a notebook, a test)
        return False
    manager = ctx.pages_manager
    main = Path(manager.main_script_path).resolve()
    pages = manager.get_pages()
    current = pages.get(ctx.page_script_hash)
    if current is None or not current.get("script_path"):
        return False
    registered = {Path(p["script_path"]).resolve() for p in pages.values() if p.get("script_path")}
    return main in registered and Path(current["script_path"]).resolve() != main


def ensure_routed() -> None:
    """Rerun through ``app.py`` when this page was started without it; otherwise do nothing.

    Call it at the top of every page file, before the page draws anything. The rerun keeps the
    URL's page and query parameters, so a shared link opens the same settings.
    """
    if not started_without_router():
        return
    from streamlit.runtime.pages_manager import PagesManager

    # 1. the older mode off for the whole server, as st.navigation turns it off
    PagesManager.uses_pages_directory = False
    # 2. the same page and query string again: this time the main script (the router) runs first
    st.rerun()
