"""What every lesson page opens with: where it sits on the path, and a question to answer first.

    lesson.header("masks")                      # section, prerequisites, the claim to verify
    unlocked = lesson.predict("masks")          # the opening question; True once it is answered
    st.toggle("Causal mask", disabled=not unlocked)

A student's answers live in their own session (``st.session_state``), under :data:`PROGRESS`;
"Check yourself" reads them all.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from core.lessons import notation, path, questions
from core.lessons.predictions import BLANK, HINT, REVEALED, RIGHT, Prediction, Progress, attempt, shown

PROGRESS = "predictions"      # {question key: Progress}, this session's answers
VIEWS = Path(__file__).resolve().parents[1] / "views"


def progress_of(key: str) -> Progress:
    return st.session_state.get(PROGRESS, {}).get(key, Progress())


def link(page: str, where=st, label: str | None = None) -> None:
    """A link to lesson page ``page`` (its address) that opens it in this tab, keeping this session's
    answers: ``st.page_link`` to the page ``app.py`` registers for the same file."""
    where.page_link(st.Page(VIEWS / f"{page}.py"), label=label or path.step(page).title)


def header(page: str) -> None:
    """The page's place on the path: the lesson section it teaches, what to see first, its claim."""
    s = path.step(page)
    st.markdown(f"**Lesson:** {s.lesson}, *{s.section}*  \n**You will verify:** {s.claim}")
    with st.container(horizontal=True, vertical_alignment="center"):
        st.markdown("**First see:**" if s.needs else "**First see:** nothing, this is where the path starts.",
                    width="content")
        for need in s.needs:
            link(need)


def predict(page: str) -> bool:
    """Ask the page's opening question; True once it is answered (right, or shown after two tries)."""
    return ask(questions.opening(page), opening=True)


def ask(p: Prediction, *, opening: bool = False) -> bool:
    """Ask ``p`` in a box: the answer, a Check button, then the hint or the answer. True when done."""
    progress = progress_of(p.key)
    with st.container(border=True):
        st.markdown(("**Predict first.** " if opening else "**Your turn.** ") + p.prompt)
        field = f"predict_{p.key}"
        if p.options:
            answer = st.radio(p.prompt, p.options, index=None, key=field, disabled=progress.done,
                              label_visibility="collapsed")
        else:
            answer = st.text_input(p.prompt, key=field, disabled=progress.done, placeholder="a number",
                                   label_visibility="collapsed")
        verdict = shown(progress, p)
        if st.button("Check", key=f"{field}_check", disabled=progress.done):
            progress, verdict = attempt(progress, p, answer)
            st.session_state.setdefault(PROGRESS, {})[p.key] = progress
            if progress.done:
                st.rerun()    # drawn again closed: the answer fixed, the control it locked open
        if verdict.stage == RIGHT:
            st.success(verdict.text)
        elif verdict.stage == REVEALED:
            st.info(verdict.text)
        elif verdict.stage == HINT:
            st.warning(verdict.text)
        elif verdict.stage == BLANK and verdict.text:
            st.caption(verdict.text)
        if opening and not progress.done:
            st.caption("Answer first: the control that shows it unlocks once you have.")
    return progress.done


def notation_card() -> None:
    """The notation every page uses, folded in the sidebar."""
    with st.expander("Notation"):
        st.markdown("\n".join(f"- ${symbol}$: {meaning}" for symbol, meaning in notation.SYMBOLS))
        st.caption(notation.HEAD_NAMES)
