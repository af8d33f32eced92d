"""Property-based tests of every function that reads what a person typed, linked or uploaded.

Whatever arrives, each either returns a value inside its stated bounds or raises a ``ValueError``
with a message; nothing else escapes, so no traceback can reach a page.
"""
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core import encoder
from core.validate import as_float_array, max_abs, parse_matrix
from ui import state
from core.model.upload import weights_from_upload
from ui.widgets import tokens_from

LIMIT = 1e3
finite_cells = st.floats(-LIMIT, LIMIT, allow_nan=False, allow_infinity=False)
bad_cells = st.sampled_from([None, "", "   ", "abc", "1,5", float("nan"), float("inf"), -float("inf"),
                             1e300, -1e7, "nan", "1e400"])


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 5), data=st.data())
def test_parse_matrix_reads_good_tables_exactly(rows, cols, data):
    M = np.array(data.draw(st.lists(st.lists(finite_cells, min_size=cols, max_size=cols),
                                    min_size=rows, max_size=rows)))
    as_text = [[repr(float(x)) for x in row] for row in M]
    np.testing.assert_array_equal(parse_matrix(M, "W", shape=(rows, cols), limit=LIMIT), M)
    np.testing.assert_array_equal(parse_matrix(as_text, "W", limit=LIMIT), M)


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 4), bad=bad_cells, data=st.data())
def test_parse_matrix_names_the_first_bad_cell(rows, cols, bad, data):
    table = [[0.5] * cols for _ in range(rows)]
    i, j = data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, cols - 1))
    table[i][j] = bad
    with pytest.raises(ValueError, match=f"row {i + 1}, column {j + 1}"):
        parse_matrix(table, "W", limit=LIMIT)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), bad=st.sampled_from([np.nan, np.inf, -np.inf]),
       data=st.data())
def test_as_float_array_refuses_any_non_finite_entry(shape, bad, data):
    x = np.zeros(shape)
    x.flat[data.draw(st.integers(0, x.size - 1))] = bad
    with pytest.raises(ValueError, match="Q contains (NaN|an infinite value)"):
        as_float_array(x, "Q")


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=20))
def test_as_float_array_converts_integers(values):
    out = as_float_array(values, "X")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.array(values, dtype=float))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200), cap=st.integers(1, 16))
def test_tokens_from_any_text(text, cap):
    try:
        tokens = tokens_from(text, max_tokens=cap)
    except ValueError as err:
        assert str(err)
        return
    assert 1 <= len(tokens) <= cap and all(tok and not tok.isspace() for tok in tokens)


SPEC = {
    "T": state.int_field(6, 1, 16),
    "gain": state.float_field(3.0, 0.0, 10.0),
    "causal": state.bool_field(True),
    "preset": state.choice_field("uniform", ("uniform", "self", "first_token")),
    "sentence": state.text_field("The tired cat"),
    "Q": state.matrix_field(),
}
link_values = st.one_of(st.text(max_size=40), st.lists(st.text(max_size=10), max_size=3),
                        st.sampled_from(["nan", "inf", "-1", "1e309", "7.5", "1;2", "1,2;3", "0x10"]))


@settings(max_examples=150, deadline=None)
@given(params=st.dictionaries(st.sampled_from(list(SPEC) + ["other"]), link_values, max_size=7))
def test_any_link_decodes_to_values_within_bounds(params):
    values, problems = state.decode(params, SPEC)
    assert 1 <= values["T"] <= 16 and isinstance(values["T"], int)
    assert 0.0 <= values["gain"] <= 10.0 and math.isfinite(values["gain"])
    assert isinstance(values["causal"], bool)
    assert values["preset"] in SPEC["preset"].choices
    assert values["Q"] is None or np.isfinite(values["Q"]).all()
    assert all(isinstance(p, str) and p for p in problems)


@settings(max_examples=40, deadline=None)
@given(raw=st.binary(max_size=2048))
def test_any_uploaded_bytes_are_refused_with_a_message(raw):
    with pytest.raises(ValueError):
        weights_from_upload(raw, n_heads=4, positional="sinusoidal")


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(1, 4000), flip=st.integers(0, 255))
def test_truncated_or_corrupted_weight_files_are_refused(cut, flip):
    cfg = encoder.EncoderConfig()
    buf = io.BytesIO()
    np.savez(buf, **encoder.init_params(cfg, seed=0))
    good = buf.getvalue()
    weights_from_upload(good, n_heads=4, positional="sinusoidal")      # the intact file loads
    truncated = good[: len(good) * cut // 4001]
    with pytest.raises(ValueError):
        weights_from_upload(truncated, n_heads=4, positional="sinusoidal")
    corrupted = bytearray(good)
    corrupted[:4] = bytes([flip, 0, 0, 0]) if flip != 0x50 else b"XXXX"   # break the zip signature
    with pytest.raises(ValueError):
        weights_from_upload(bytes(corrupted), n_heads=4, positional="sinusoidal")


@settings(max_examples=120, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_max_abs_is_the_largest_magnitude_or_non_finite(dtype, data):
    """``max_abs`` compares magnitudes as integers (the bits of a float with its sign cleared):
    it must agree with NumPy on any floats, subnormals, -0.0 and the dtype's extremes included,
    and report NaN or infinity whenever the array holds one."""
    values = data.draw(st.lists(st.floats(width=32 if dtype == np.float32 else 64), min_size=1, max_size=40))
    x = np.array(values, dtype=dtype)
    peak = max_abs(x)
    if np.isfinite(x).all():
        assert peak == float(np.abs(x).max())
    else:
        assert not math.isfinite(peak)
        assert math.isnan(peak) == bool(np.isnan(x).any())


# --- the inputs of attention: each rule holds, or the first one broken is named ---------------

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=5).map(tuple)


def first_broken_shape_rule(q, k, v) -> str | None:
    """The shape rules of ``core.validate.attention_inputs``, in their order, as plain Python."""
    for shape, name in ((q, "Q"), (k, "K"), (v, "V")):
        if not 2 <= len(shape) <= 4:
            return f"{name} must have 2 to 4 dimensions"
        if 0 in shape:
            return f"{name} is empty"
    if not q[:-2] == k[:-2] == v[:-2]:
        return "must share their batch/head axes"
    if q[-1] != k[-1]:
        return "same width d_k"
    if k[-2] != v[-2]:
        return "one row per key position"
    return None


@settings(max_examples=300, deadline=None)
@given(q=shapes, k=shapes, v=shapes)
def test_attention_shapes_pass_or_the_first_broken_rule_is_named(q, k, v):
    """The few comparisons that pass good shapes and the rule-by-rule messages agree, any shapes."""
    from core.validate import attention_inputs

    broken = first_broken_shape_rule(q, k, v)
    if broken is None:
        Q4, K4, V4, mask, scale, lead = attention_inputs(np.ones(q), np.ones(k), np.ones(v))
        assert lead == q[:-2] and Q4.ndim == K4.ndim == V4.ndim == mask.ndim == 4
        assert Q4.shape[-2:] == q[-2:] and V4.shape[-2:] == v[-2:]
    else:
        with pytest.raises(ValueError, match=broken):
            attention_inputs(np.ones(q), np.ones(k), np.ones(v))


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), T=st.integers(1, 4), d=st.integers(1, 3),
       where=st.sampled_from(["Q", "K", "V", "mask", None]),
       bad=st.sampled_from([np.nan, np.inf, -np.inf, "huge"]), data=st.data())
def test_attention_values_pass_or_the_first_broken_rule_is_named(dtype, T, d, where, bad, data):
    """One compiled pass decides; the message names the rule: NaN or infinity in Q, K or V, NaN or
    +inf in the mask (-inf is allowed there), or scores beyond what the dtype holds."""
    from core.validate import attention_inputs

    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    arrays = {"Q": rng.standard_normal((T, d)), "K": rng.standard_normal((T, d)),
              "V": rng.standard_normal((T, d)), "mask": np.zeros((T, T))}
    arrays = {name: x.astype(dtype) for name, x in arrays.items()}
    if where is not None:
        x = arrays[where]
        x.flat[data.draw(st.integers(0, x.size - 1))] = float(np.finfo(dtype).max) / 2 if bad == "huge" else bad
    if where in ("Q", "K", "V") and bad != "huge":
        expected = f"{where} contains {'NaN' if bad != bad else 'an infinite value'}"
    elif where == "mask" and (bad != bad or bad == np.inf):
        expected = "not NaN or \\+inf"
    elif (float(np.abs(arrays["Q"]).max()) / math.sqrt(d) * max(float(np.abs(arrays["K"]).max()) * d, 1.0)
          > float(np.finfo(dtype).max) / 4):
        expected = "too large"          # |q . k| / sqrt(d_k) could come near the dtype's largest number
    else:   # nothing wrong: a huge V, a huge or -inf mask entry are all fine
        expected = None
    if expected is None:
        attention_inputs(arrays["Q"], arrays["K"], arrays["V"], arrays["mask"])
    else:
        with pytest.raises(ValueError, match=expected):
            attention_inputs(arrays["Q"], arrays["K"], arrays["V"], arrays["mask"])


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from([np.float32, np.float64]), T=st.integers(1, 9), d=st.integers(1, 5),
       parts=st.integers(1, 7), where=st.sampled_from(["Q", "K", "V", "mask", None]),
       bad=st.sampled_from([np.nan, np.inf, -np.inf, "huge"]), data=st.data())
def test_parallel_value_check_agrees_with_the_serial_one(dtype, T, d, parts, where, bad, data):
    """Large inputs are checked by the threads together, each array cut into pieces: a bad entry
    anywhere (the first or last of a piece included) is found as the one-thread pass finds it."""
    from core.validate import _LARGEST, _arrays_ok, _arrays_ok_parallel

    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    H = data.draw(st.integers(1, 3))
    arrays = {"Q": rng.standard_normal((1, H, T, d)), "K": rng.standard_normal((1, H, T, d)),
              "V": rng.standard_normal((1, H, T, d)), "mask": np.triu(np.full((1, 1, T, T), -np.inf), 1)}
    arrays = {name: x.astype(dtype) for name, x in arrays.items()}
    if where is not None:
        x = arrays[where]
        x.flat[data.draw(st.integers(0, x.size - 1))] = float(np.finfo(dtype).max) / 2 if bad == "huge" else bad
    args = (arrays["Q"], arrays["K"], arrays["V"], arrays["mask"], 1 / math.sqrt(d), _LARGEST[np.dtype(dtype)])
    serial = _arrays_ok(*args)
    assert _arrays_ok_parallel(*args, parts) == serial
    if where in ("Q", "K", "V") and bad != "huge" or where == "mask" and bad != -np.inf and bad != "huge":
        assert not serial


def test_large_inputs_are_refused_as_small_ones_are():
    """Past the size where the threads share the check, the last entry of each input still counts."""
    from core.validate import PARALLEL_CHECK_MIN, attention_inputs

    T, d = 256, 256
    assert 4 * T * d >= PARALLEL_CHECK_MIN
    rng = np.random.default_rng(0)
    for where, bad, message in (("Q", np.nan, "Q contains NaN"), ("K", np.inf, "K contains an infinite"),
                                ("V", -np.inf, "V contains an infinite"), ("mask", np.nan, "not NaN")):
        arrays = {"Q": rng.standard_normal((T, d)), "K": rng.standard_normal((T, d)),
                  "V": rng.standard_normal((T, d)), "mask": np.zeros((T, T))}
        arrays[where][-1, -1] = bad
        with pytest.raises(ValueError, match=message):
            attention_inputs(arrays["Q"], arrays["K"], arrays["V"], arrays["mask"])
