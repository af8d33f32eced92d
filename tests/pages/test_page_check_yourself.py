"""The Check yourself page: answers marked with explanations; exercises marked by running them."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import exercises
from core.lessons import heads
from ui.state import pending_key

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "check_yourself.py")


def test_questions_are_marked_with_explanations():
    at = open_page(PAGE)
    assert not at.exception
    assert [h.value for h in at.header] == ["Questions", "Count it", "Exercise: a sharper first-token head",
                                            "Exercise: one row, two places"]
    # unanswered, then wrong, then right
    at.button(key="cy_head_width_check").click().run()
    assert "Pick one" in at.warning[0].value
    at.radio(key="cy_head_width").set_value("8")
    at.button(key="cy_head_width_check").click().run()
    assert not at.success and "the answer is “32”" in at.warning[0].value
    at.radio(key="cy_head_width").set_value("32")
    at.button(key="cy_head_width_check").click().run()
    assert at.success[0].value.startswith("Right.")
    # a typed count, with thousands separators
    at.text_input(key="cy_params_384").set_value("589,824")
    at.button(key="cy_params_384_check").click().run()
    assert not at.exception and "589,824" in at.success[-1].value


def check_first_token_row(at, gain):
    """Row T of the first-token head on screen, by the formula: key 1 scores m = gain / sqrt(d_k),
    the other T - 1 keys 0, so p = e^m / (e^m + T - 1) on key 1 and (1 - p) / (T - 1) on each other."""
    T, d_k = exercises.FIRST_TOKEN_T, exercises.FIRST_TOKEN_D_K
    e = np.exp(gain / np.sqrt(d_k))
    p, rest = e / (e + T - 1), 1 / (e + T - 1)
    bits = -p * np.log2(p) - (T - 1) * rest * np.log2(rest)
    shown = {m.label: float(m.value) for m in at.metric if m.label.startswith("Row")}
    assert shown[f"Row {T}: weight on token 1"] == pytest.approx(p, abs=1e-4)
    assert shown[f"Row {T}: effective positions 2^H"] == pytest.approx(2 ** bits, abs=1e-4)


@pytest.mark.parametrize("gain", [3.0, 6.0, 0.0, -2.5])
def test_the_gain_moves_the_first_token_row_as_the_formula_says(gain):
    at = open_page(PAGE)
    at.slider(key="cy_gain").set_value(gain).run()
    assert not at.exception
    check_first_token_row(at, gain)


def test_first_token_gain_exercise():
    at = open_page(PAGE)
    at.button(key="cy_gain_check").click().run()                       # the lesson's gain 3: not yet
    assert "3.542 effective positions" in at.warning[0].value
    needed = exercises.first_token_gain_needed()
    at.slider(key="cy_gain").set_value(round(needed + 0.1, 1))
    at.button(key="cy_gain_check").click().run()
    assert not at.exception and at.success and "Below 1.1" in at.success[0].value


def test_two_position_exercise_is_marked_from_the_typed_matrices():
    at = open_page(PAGE)
    at.button(key="cy_two_check").click().run()                        # zeros: a uniform row 4
    assert "Not yet" in at.warning[0].value
    Q, K = heads.two_positions(6, 2, 3.0)
    at.session_state[pending_key("check_yourself", "Q")] = Q.tolist()
    at.session_state[pending_key("check_yourself", "K")] = K.tolist()
    at.run()
    at.button(key="cy_two_check").click().run()
    assert not at.exception
    assert at.success and "position 1 gets 0.446, position 3 0.446" in at.success[0].value
    # a bad typed matrix is a warning, and the last good values stay
    at.session_state[pending_key("check_yourself", "K")] = [["x", "1"]] * 6
    at.run()
    assert not at.exception and any("not a number" in w.value for w in at.warning)
    at.button(key="cy_two_check").click().run()
    assert at.success                                                  # still the good K
    np.testing.assert_allclose(exercises.check_two_position_head(Q, K).weights[3, [0, 2]], 0.446, atol=1e-3)


def test_worked_solution_shows_the_lessons_matrices_and_they_pass():
    Qs, Ks = heads.two_positions(6, 2, 3.0)
    solution = f"Q =\n{Qs}\nK =\n{Ks}"
    at = open_page(PAGE)
    assert all(c.value != solution for c in at.code)                   # hidden until asked for
    at.checkbox(key="cy_two_solution").check().run()
    assert any(c.value == solution for c in at.code)
    assert exercises.check_two_position_head(Qs, Ks).ok


def test_verdicts_stay_and_the_score_runs():
    """A verdict stays while other questions are answered and checked; the score counts the latest
    verdict of each checked answer; changing an answer clears its verdict (it judged the old one)."""
    score = lambda at: next(m.value for m in at.metric if m.label == "Score so far")  # noqa: E731
    at = open_page(PAGE)
    assert score(at) == "nothing checked yet"
    at.radio(key="cy_head_width").set_value("32")
    at.button(key="cy_head_width_check").click().run()
    assert score(at) == "1 of 1 checked"
    second = exercises.QUESTIONS[1]
    at.radio(key=f"cy_{second.key}").set_value(second.options[0]).run()        # the next answer picked
    assert [s.value for s in at.success][:1] and at.success[0].value.startswith("Right.")   # Q1's stays
    at.button(key=f"cy_{second.key}_check").click().run()                      # a wrong one
    assert at.success[0].value.startswith("Right.") and len(at.warning) == 1
    assert score(at) == "1 of 2 checked"
    at.text_input(key="cy_params_384").set_value("589,824")
    at.button(key="cy_params_384_check").click().run()
    assert score(at) == "2 of 3 checked" and len(at.success) == 2
    at.radio(key="cy_head_width").set_value("8").run()                         # Q1 changed: its verdict goes
    assert score(at) == "1 of 2 checked" and len(at.success) == 1
