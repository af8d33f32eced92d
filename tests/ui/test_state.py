"""URL state: pure encode/decode round trips, bad values fall back with a message that names them,
values held by widgets checked against their field, matrices as text."""
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


BAD_LINK_VALUES = [
    ("T", "abc"), ("T", "99"), ("T", "2.5"), ("T", "nan"), ("T", "1e308"), ("T", "-inf"), ("gain", "inf"),
    ("gain", "-1"), ("gain", "NaN"), ("gain", ""), ("causal", "maybe"), ("preset", "nonsense"),
    ("sentence", "x" * 1000), ("Q", "1,2;3"), ("Q", "1,abc"), ("Q", "1,"), ("Q", "nan,0"), ("Q", "inf,0"),
    ("Q", "1e300,0"),
]


@pytest.mark.parametrize("name, raw", BAD_LINK_VALUES)
def test_bad_value_falls_back_to_default_with_a_message_naming_it(name, raw):
    values, problems = state.decode({name: raw}, SPEC)
    assert values[name] == SPEC[name].default or values[name] is None
    (problem,) = problems
    # the setting, the value given (cut short when long) and the value used instead
    assert problem.startswith(f"{name}={state.shown(raw)} in the link: ")
    used = "the page's own matrix" if name == "Q" else state.describe(SPEC[name], SPEC[name].default)
    assert f"Using the default, {used}, instead." in problem


def test_a_long_value_is_quoted_cut_short():
    assert state.shown("x" * 1000) == "“" + "x" * state.SHOWN_CHARS + "…”"
    assert state.shown("L9H9") == "“L9H9”" and state.shown(2.5) == "“2.5”" and state.shown(3.0) == "“3”"


def test_ranges_in_messages_read_as_written():
    with pytest.raises(ValueError, match="a whole number from 1 to 1000000"):
        state.parse_value(state.int_field(10, 1, 1_000_000), "0", "vocab")
    with pytest.raises(ValueError, match=r"a number from 0\.1 to 5"):
        state.parse_value(state.float_field(1.0, 0.1, 5.0), "9", "temperature")


def test_unknown_names_are_problems_and_lists_take_the_last_value():
    values, problems = state.decode({"heads": "999", "gian": "2", "T": ["3", "4"]}, SPEC)
    assert values["T"] == 4 and values["gain"] == SPEC["gain"].default
    gian, heads = sorted(problems)
    assert gian.startswith("gian=“2” in the link: ") and "did you mean gain?" in gian
    assert heads.startswith("heads=“999” in the link: ") and "no setting called “heads”" in heads
    assert all("ignored" in p for p in problems)


@pytest.mark.parametrize("name, held, expected", [
    ("T", 3.0, 3), ("T", 7, 7), ("gain", 2, 2.0), ("causal", False, False), ("preset", "self", "self"),
])
def test_a_value_held_by_a_widget_is_checked_as_the_field_own(name, held, expected):
    value = state.check_value(SPEC[name], held, name)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("name, held", [
    ("T", 2.5), ("T", 1e308), ("T", float("nan")), ("T", float("inf")), ("T", 1), ("T", True), ("T", "6"),
    ("gain", float("nan")), ("gain", 11.0), ("gain", -float("inf")), ("preset", "nonsense"),
])
def test_a_value_held_by_a_widget_that_the_field_does_not_allow_is_refused(name, held):
    with pytest.raises(ValueError, match=name):
        state.check_value(SPEC[name], held, name)


def test_a_whole_float_from_a_number_box_goes_into_the_link_as_a_whole_number():
    assert state.encode({"T": 9.0}, SPEC) == {"T": "9"}


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
