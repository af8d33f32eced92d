"""The pages' side of the background warm-up (``core.warmup``): wait for it with a progress bar."""
import streamlit as st

from core import warmup


def wait_for_kernels(step: str | None = None, why: str = "Later visits start at once.") -> None:
    """Ask the server's warm-up for ``step`` (a ``core.warmup`` step name, an on-demand one included;
    every step asked for when None), and while it has not loaded show its progress, and ``why`` the
    page waits, and wait; return at once when it has (or when no warm-up runs in this process)."""
    warm = warmup.start_once()
    warm.want(step)                      # next in the background (again, if the warm-up had finished)
    if warm.has_done(step):
        return
    bar = st.empty()
    with warm.page_waiting():            # the step loads here while this page waits for it
        while True:
            done, total, current = warm.progress()
            bar.progress(done / max(total, 1),
                         text=f"This server has just started: compiling {current or 'the last kernels'} in the "
                              f"background ({done} of {total} steps done). {why}")
            if warm.has_done(step) or warm.wait(0.5):
                break
    bar.empty()
