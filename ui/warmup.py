"""The pages' side of the background warm-up (``core.warmup``): wait for it with a progress bar."""
import streamlit as st

from core import warmup


def wait_for_kernels(step: str | None = None, why: str = "Later visits start at once.") -> None:
    """While the server's background warm-up has not yet compiled ``step`` (a ``core.warmup`` step
    name; every step when None) show its progress, and ``why`` the page waits, and wait; return at
    once when none runs (a warm server, or a page opened without ``app.py``)."""
    warm = warmup.running()
    if warm is None or warm.has_done(step):
        return
    warm.want(step)
    bar = st.empty()
    while True:
        done, total, current = warm.progress()
        bar.progress(done / max(total, 1),
                     text=f"This server has just started: compiling {current or 'the last kernels'} in the "
                          f"background ({done} of {total} steps done). {why}")
        if warm.has_done(step) or warm.wait(0.5):
            break
    bar.empty()
