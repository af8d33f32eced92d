"""Predict, then see: how an answer is judged and scored, and that every page's questions are sound."""
import pytest

from core.lessons import path, questions
from core.lessons.predictions import (BLANK, HINT, RIGHT, REVEALED, Prediction, Progress, attempt, is_right,
                                      parse_number, score)

CHOICE = Prediction("t.choice", "one_head", "Which?", answer=1, hint="look", why="because",
                    options=("a", "b", "c"))
NUMBER = Prediction("t.number", "parameters", "How many?", answer=589_824, hint="count", why="4·384²")
ROUGH = Prediction("t.rough", "one_head", "About?", answer=2.0, hint="h", why="w", tolerance=0.05)


def test_right_at_the_first_try_counts_and_closes_the_question():
    p, v = attempt(Progress(), CHOICE, "b")
    assert (p.tries, p.first_try_right, p.done, v.stage) == (1, True, True, RIGHT)
    assert v.text == "Right. because"


def test_a_wrong_answer_gets_the_hint_then_a_second_gets_the_answer():
    p, v = attempt(Progress(), CHOICE, "a")
    assert (p.tries, p.first_try_right, p.done, v.stage) == (1, False, False, HINT)
    assert "look" in v.text and "“b”" not in v.text and " b." not in v.text      # the hint, not the answer
    p, v = attempt(p, CHOICE, "c")
    assert (p.tries, p.first_try_right, p.done, v.stage) == (2, False, True, REVEALED)
    assert v.text.startswith("The answer: b.") and "because" in v.text


def test_right_at_the_second_try_still_scores_as_a_wrong_first_try():
    p, _ = attempt(Progress(), CHOICE, "a")
    p, v = attempt(p, CHOICE, "b")
    assert v.stage == RIGHT and p.done and p.first_try_right is False
    assert score([p]) == (0, 1)


def test_a_closed_question_is_not_judged_again():
    """Re-checking the revealed option after two wrong tries must not turn it into a right answer."""
    p, _ = attempt(Progress(), CHOICE, "a")
    p, _ = attempt(p, CHOICE, "c")
    again, v = attempt(p, CHOICE, "b")
    assert again == p and v.stage == REVEALED and score([again]) == (0, 1)
    right, _ = attempt(Progress(), CHOICE, "b")
    assert attempt(right, CHOICE, "a")[0] == right


def test_no_answer_costs_no_try():
    for q, blank in ((CHOICE, None), (CHOICE, "z"), (NUMBER, ""), (NUMBER, "lots"), (NUMBER, "nan")):
        p, v = attempt(Progress(), q, blank)
        assert p == Progress() and v.stage == BLANK and v.text


@pytest.mark.parametrize("typed, right", [("589,824", True), ("589 824", True), ("589_824", True), (589824, True),
                                          ("589823", False), ("5.89824e5", True)])
def test_typed_numbers(typed, right):
    assert is_right(NUMBER, typed) is right


def test_a_tolerance_is_relative_to_the_answer():
    assert is_right(ROUGH, "2.09") and is_right(ROUGH, "1.91")
    assert not is_right(ROUGH, "2.11") and not is_right(ROUGH, "1.89")


def test_options_by_index_too():
    assert is_right(CHOICE, 1) and not is_right(CHOICE, 0) and is_right(CHOICE, 7) is None


def test_parse_number():
    assert parse_number(" 1,024 ") == 1024 and parse_number(float("inf")) is None and parse_number(True) is None


def test_the_score_counts_first_tries_of_the_questions_tried():
    first = attempt(Progress(), CHOICE, "b")[0]
    second = attempt(attempt(Progress(), CHOICE, "a")[0], CHOICE, "b")[0]
    hinted = attempt(Progress(), CHOICE, "a")[0]
    assert score([first, second, hinted, Progress()]) == (1, 3)


def test_a_question_must_have_a_valid_answer():
    with pytest.raises(ValueError, match="must index one of its 2 options"):
        Prediction("x", "one_head", "?", answer=2, hint="h", why="w", options=("a", "b"))
    with pytest.raises(ValueError, match="must be finite"):
        Prediction("x", "one_head", "?", answer=float("nan"), hint="h", why="w")


# --- every page's questions ----------------------------------------------------------------------

EVERYTHING = questions.everything()


def test_every_lesson_page_asks_at_least_one_question():
    assert {s.page for s in path.STEPS} == {q.page for q in EVERYTHING}


def test_question_keys_are_unique_and_each_sits_on_the_page_whose_module_holds_it():
    assert len({q.key for q in EVERYTHING}) == len(EVERYTHING)
    for s in path.STEPS:
        for q in questions.of_page(s.page):
            assert q.page == s.page and q.key.startswith(f"{s.page}."), q.key


@pytest.mark.parametrize("q", EVERYTHING, ids=lambda q: q.key)
def test_each_question_has_a_hint_that_does_not_give_the_answer_away(q):
    assert q.prompt.strip() and q.hint.strip() and q.why.strip()
    assert q.hint != q.why
    if q.options:
        assert len(set(q.options)) == len(q.options) >= 2
        assert q.options[q.answer] not in q.hint
    else:
        assert q.answer_text not in q.hint


@pytest.mark.parametrize("q", EVERYTHING, ids=lambda q: q.key)
def test_each_question_marks_its_answer_right_and_any_other_wrong(q):
    assert attempt(Progress(), q, q.options[q.answer] if q.options else q.answer)[0].first_try_right
    wrongs = [o for o in q.options if o != q.options[q.answer]] if q.options else [q.answer * 2 + 1, -q.answer - 1]
    for wrong in wrongs:
        p, v = attempt(Progress(), q, wrong)
        assert v.stage == HINT and not p.done
