"""Every question on every page, asked as a student meets it: the right answer is marked right, a wrong
one gets the hint and then the answer, the opening question unlocks its control, and Check yourself
scores first tries only."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from core.lessons import path, questions
from core.lessons.predictions import Progress
from ui.lesson import PROGRESS

from page_support import answer_everything, answer_question, open_page

ROOT = Path(__file__).resolve().parents[2]
CHECK_YOURSELF = str(ROOT / "views" / "check_yourself.py")
EVERYTHING = questions.everything()


def page_file(q) -> str:
    return str(ROOT / "views" / f"{q.page}.py")


def open_with_only(q):
    """The page of ``q`` in a session where every other question is already answered."""
    at = AppTest.from_file(page_file(q), default_timeout=120)
    answer_everything(at)
    at.session_state[PROGRESS] = {k: v for k, v in at.session_state[PROGRESS].items() if k != q.key}
    return at.run()


def wrong_answers(q) -> list:
    if q.options:
        return [o for i, o in enumerate(q.options) if i != q.answer][:2] * (1 if len(q.options) > 2 else 2)
    return [q.answer * 2 + 1, -q.answer - 1]


def field(at, q):
    return at.radio(key=f"predict_{q.key}") if q.options else at.text_input(key=f"predict_{q.key}")


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def widgets(at) -> dict:
    """Every widget of the page that can be disabled, by its key (its label when it has none), except
    the questions' own: whether it is disabled now."""
    found = {}
    for kind in ("button", "checkbox", "toggle", "radio", "selectbox", "multiselect", "slider", "select_slider",
                 "number_input", "text_input", "text_area"):
        for w in getattr(at, kind):
            if not (w.key or "").startswith("predict_"):
                found[(kind, w.key or w.label)] = bool(w.proto.disabled)
    return found


@pytest.mark.parametrize("q", EVERYTHING, ids=lambda q: q.key)
def test_a_wrong_answer_gets_the_hint_then_the_answer_and_the_question_closes(q):
    at = open_with_only(q)
    assert not at.exception
    assert not field(at, q).disabled
    first, second = wrong_answers(q)
    at = answer_question(at, q, first)
    assert any(q.hint in w for w in texts(at.warning)), "the hint after a first wrong answer"
    assert not any(q.answer_text in t for t in texts(at.info)), "the answer shown too early"
    at = answer_question(at, q, second)
    assert any(t.startswith(f"The answer: {q.answer_text}.") and q.why in t for t in texts(at.info))
    assert field(at, q).disabled and at.button(key=f"predict_{q.key}_check").disabled
    assert at.session_state[PROGRESS][q.key] == Progress(2, False, True, "revealed")


@pytest.mark.parametrize("q", EVERYTHING, ids=lambda q: q.key)
def test_the_right_answer_is_marked_right_and_scored_on_check_yourself(q):
    at = open_with_only(q)
    at = answer_question(at, q, q.options[q.answer] if q.options else q.answer_text)
    assert not at.exception
    assert any(t == f"Right. {q.why}" for t in texts(at.success))
    mine = at.session_state[PROGRESS][q.key]
    assert mine == Progress(1, True, True, "right")
    # Check yourself, in a session holding only this answer
    cy = open_page(CHECK_YOURSELF, answered=False)
    cy.session_state[PROGRESS] = {q.key: mine}
    cy.run()
    metrics = {m.label: m.value for m in cy.metric}
    assert metrics["Right at the first try"] == "1 of 1"
    assert f"- ✅ right at the first try · {q.prompt}" in " ".join(texts(cy.markdown))


@pytest.mark.parametrize("q", [questions.opening(p) for p in sorted({q.page for q in EVERYTHING})],
                         ids=lambda q: q.page)
def test_the_opening_question_unlocks_a_control_of_its_page(q):
    """Before the answer some control of the page is disabled; after it, that control works."""
    at = open_page(page_file(q), answered=False)
    assert not at.exception
    before = widgets(at)
    at = answer_question(at, q, q.options[q.answer] if q.options else q.answer_text)
    after = widgets(at)
    unlocked = [w for w, disabled in before.items() if disabled and after.get(w) is False]
    assert unlocked, "no control of the page unlocked by the opening question"


def test_check_yourself_scores_first_tries_only():
    """Three questions: right at once, right after a hint, shown after two tries: 1 of 3 at the first try."""
    a, b, c = EVERYTHING[:3]
    cy = open_page(CHECK_YOURSELF, answered=False)
    cy.session_state[PROGRESS] = {a.key: Progress(1, True, True, "right"), b.key: Progress(2, False, True, "right"),
                                  c.key: Progress(2, False, True, "revealed")}
    cy.run()
    metrics = {m.label: m.value for m in cy.metric}
    assert metrics["Right at the first try"] == "1 of 3"
    assert metrics["Questions answered"] == f"3 of {len(EVERYTHING)}"
    table = " ".join(texts(cy.markdown))
    assert f"- right at the second try · {b.prompt}" in table
    assert f"- answer shown after two tries · {c.prompt}" in table
    assert table.count("- not answered yet · ") == len(EVERYTHING) - 3
    assert [link.proto.page for link in cy.get("page_link")] == [s.page for s in path.STEPS]
