"""The Check yourself page: answers marked with explanations; exercises marked by running them."""
from pathlib import Path

import numpy as np
import pytest

from core.lessons import exercises
from core.lessons import heads
from ui.state import pending_key

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "check_yourself.py")


def test_the_page_gathers_the_answers_then_two_exercises():
    at = open_page(PAGE, answered=False)
    assert not at.exception
    assert [h.value for h in at.header] == ["Your answers, page by page", "Exercise: a sharper first-token head",
                                            "Exercise: one row, two places"]
    assert {m.label: m.value for m in at.metric}["Right at the first try"] == "nothing answered yet"


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


def test_exercise_verdicts_stay_and_count():
    """A verdict stays while the other exercise is checked; changing an answer clears its verdict
    (it judged the old one), and the count follows."""
    passed = lambda at: next(m.value for m in at.metric if m.label == "Exercises passed")  # noqa: E731
    at = open_page(PAGE)
    assert passed(at) == "0 of 2"
    at.slider(key="cy_gain").set_value(round(exercises.first_token_gain_needed() + 0.1, 1))
    at.button(key="cy_gain_check").click().run()
    assert passed(at) == "1 of 2" and len(at.success) == 1
    at.button(key="cy_two_check").click().run()                        # zeros: not yet
    assert passed(at) == "1 of 2" and len(at.success) == 1 and len(at.warning) == 1
    at.slider(key="cy_gain").set_value(3.0).run()                      # the gain changed: its verdict goes
    assert passed(at) == "0 of 2" and not at.success
