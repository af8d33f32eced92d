"""The Check yourself page: answers marked with explanations; exercises marked by running them."""
from pathlib import Path

import numpy as np

from core import exercises, heads
from ui.state import pending_key

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "check_yourself.py")


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
    assert not at.exception and "589,824" in at.success[0].value


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
