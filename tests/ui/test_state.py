"""URL state: pure encode/decode round trips, bad values fall back with a message, matrices as text."""
import numpy as np
import pytest

from core.validate import parse_matrix
from ui import state

SPEC = {
    "T": state.int_field(6, 2, 16), "gain": state.float_field(3.0, 0.0, 10.0),
    "causal": state.bool_field(True), "preset": state.choice_field("uniform", ("uniform", "self")),
    "sentence": state.text_field("The cat"), "Q": state.matrix_field(),
}


def test_round_trip_of_non_defaults():
    values = {"T": 9, "gain": 4.5, "causal": False, "preset": "self", "sentence": "a b  c", "Q": np.eye(2)}
    params = state.encode(values, SPEC)
    assert params == {"T": "9", "gain": "4.5", "causal": "0", "preset": "self", "sentence": "a b  c",
                      "Q": "1,0;0,1"}
    back, problems = state.decode(params, SPEC)
    assert problems == []
    assert {k: v for k, v in back.items() if k != "Q"} == {k: v for k, v in values.items() if k != "Q"}
    np.testing.assert_array_equal(back["Q"], np.eye(2))


def test_defaults_are_left_out_of_the_link():
    assert state.encode({name: f.default for name, f in SPEC.items()}, SPEC) == {}
    values, problems = state.decode({}, SPEC)
    assert problems == [] and values["T"] == 6 and values["Q"] is None


@pytest.mark.parametrize("name, raw", [
    ("T", "abc"), ("T", "99"), ("T", "2.5"), ("T", "nan"), ("gain", "inf"), ("gain", "-1"),
    ("causal", "maybe"), ("preset", "nonsense"), ("sentence", "x" * 1000),
    ("Q", "1,2;3"), ("Q", "1,abc"), ("Q", "1,"), ("Q", "nan,0"), ("Q", "inf,0"), ("Q", "1e300,0"),
])
def test_bad_value_falls_back_to_default_with_message(name, raw):
    values, problems = state.decode({name: raw}, SPEC)
    assert values[name] == SPEC[name].default or values[name] is None
    assert len(problems) == 1 and name in problems[0] and "default" in problems[0]


def test_unknown_names_are_ignored_and_lists_take_the_last_value():
    values, problems = state.decode({"other_page": "x", "T": ["3", "4"]}, SPEC)
    assert problems == [] and values["T"] == 4


def test_matrix_text_round_trip_keeps_8_digits():
    M = np.array([[0.123456789, -2.0], [1e-3, 1000.0]])
    back = parse_matrix(state.matrix_from_text(state.matrix_to_text(M)), "M")
    np.testing.assert_allclose(back, M, rtol=1e-8)


@pytest.mark.parametrize("cell, words", [("", "blank"), ("abc", "not a number"), ("nan", "NaN"),
                                         ("inf", "infinite"), ("1e300", "beyond")])
def test_parse_matrix_names_the_bad_cell(cell, words):
    with pytest.raises(ValueError, match=words):
        parse_matrix([["1", cell]], "Q", limit=1e3)


def test_unknown_field_kind_is_refused():
    with pytest.raises(ValueError):
        state.Field("colour", None)
