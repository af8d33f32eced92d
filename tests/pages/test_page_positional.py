"""The Positional encoding page: order blindness measured, and every number of the sinusoidal
code (offset property, similarity curve, near collisions, RoPE scores) checked against the
formulas for each control."""
import re
from pathlib import Path

import numpy as np
import pytest

from core import positional
from core.lessons import positions
from core.kernels import reference as ref

from page_support import matrix_named, open_page

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "positional.py")
DEFAULTS = dict(T=50, d=128, base=10000.0, origin=0, k=5, Tc=100, Ts=8)


def markdown(at):
    return " ".join(m.value for m in at.markdown)


def table_with(at, first_column):
    return next(d.value for d in at.dataframe if d.value.columns[0] == first_column)


def rope(x, p, base):
    """Rotate the feature pairs of ``x`` by ``p * base**(-2i/d)`` (the RoPE formula)."""
    theta = p * base ** (-np.arange(0, len(x), 2) / len(x))
    even, odd = x[0::2], x[1::2]
    out = np.empty_like(x)
    out[0::2] = even * np.cos(theta) - odd * np.sin(theta)
    out[1::2] = even * np.sin(theta) + odd * np.cos(theta)
    return out


def check_code(at, *, T, d, base, origin, k, Tc, Ts):
    """The sinusoidal code's numbers on screen, from the formula PE[p, 2i] = sin(p / base^(2i/d)),
    PE[p, 2i+1] = cos(...), computed here with the NumPy reference."""
    assert not at.exception
    PE = ref.sinusoidal(T, d, base)
    # 1. PE_p . PE_(p+k) is one number for every p
    dots = (PE[:-k] * PE[k:]).sum(1)
    shown = re.search(r"Sinusoidal: every p gives (-?[\d.]+); spread max − min = \*\*([\d.e+-]+)\*\*", markdown(at))
    assert float(shown[1]) == pytest.approx(dots.mean(), abs=2e-6) and float(shown[2]) < 1e-9
    # 2. the cosine similarity of every position to the chosen one
    curve = table_with(at, "position")
    norms = np.linalg.norm(PE, axis=1)
    np.testing.assert_array_equal(curve["position"], np.arange(T))
    np.testing.assert_allclose(curve["cosine"], PE @ PE[origin] / (norms * norms[origin]), atol=1e-12)
    assert curve["cosine"][origin] == pytest.approx(1.0)
    # 3. the closest pair per width: its distance is the true minimum over all pairs, and the pair
    #    shown attains it (many pairs tie to rounding: which one is shown is not part of the claim)
    pairs = table_with(at, "d_model")
    assert pairs["d_model"].tolist() == [2, 4, 8, 16, 32, 64]
    for _, row in pairs.iterrows():
        code = ref.sinusoidal(Tc, int(row["d_model"]), base)
        gaps = np.linalg.norm(code[:, None] - code[None], axis=-1)[np.triu_indices(Tc, 1)]
        i, j = map(int, row["closest pair"].split(" and "))
        assert 0 <= i < j < Tc and row["apart"] == j - i
        assert row["distance"] == pytest.approx(gaps.min(), rel=1e-9, abs=1e-12)
        assert np.linalg.norm(code[i] - code[j]) == pytest.approx(gaps.min(), rel=1e-9, abs=1e-12)
    # 4. RoPE scores with one q and one k at every position: S[m, n] = R(m) q . R(n) k / sqrt(8)
    rng = np.random.default_rng(0)                       # the page's seeded q and k
    q, kk = rng.normal(size=8), rng.normal(size=8)
    want = np.array([[rope(q, m, base) @ rope(kk, n, base) for n in range(Ts)] for m in range(Ts)]) / np.sqrt(8)
    np.testing.assert_allclose(matrix_named(at, "RoPE S"), want, atol=1e-12)
    return pairs


def test_page_shows_order_blindness_and_the_sinusoidal_code():
    at = open_page(PAGE)
    assert not at.exception
    headings = [h.value for h in at.header]
    assert headings == ["Attention alone is blind to order", "The sinusoidal code", "Other codes, seen in the scores"]
    plain = positions.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=False, backend="cpu")
    coded = positions.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=True, backend="cpu")
    assert plain.is_permutation and not coded.is_permutation
    gaps = [m.value for m in at.metric]
    assert gaps == [f"{plain.gap:.2e}", f"{coded.gap:.2e}"]
    assert float(gaps[0]) < 1e-12 < 0.1 < float(gaps[1])
    text = markdown(at)
    assert "outputs are **a permutation** of each other; with positions they are **different**" in text
    assert "Kernel source" in " ".join(e.label for e in at.expander)


def test_default_code_numbers_and_near_collisions():
    at = open_page(PAGE)
    assert not at.error
    pairs = check_code(at, **DEFAULTS)
    # d_model = 2: two positions 44 apart (~7 turns of 2 pi) nearly collide on the unit circle
    assert pairs["apart"][0] == 44 and pairs["distance"][0] < 0.02 < pairs["typical |PE|"][0]
    assert pairs["apart"].iloc[-1] == 1                                # d_model = 64: neighbours only


@pytest.mark.parametrize("widget, key, value, changes", [
    ("slider", "T", 20, dict(T=20)),
    ("slider", "d", 4, dict(d=4)),
    ("number_input", "base", 500.0, dict(base=500.0)),
    ("slider", "from", 10, dict(origin=10)),
    ("slider", "k", 3, dict(k=3)),
    ("slider", "Tc", 40, dict(Tc=40)),
    ("slider", "Ts", 5, dict(Ts=5)),
])
def test_each_control_moves_the_numbers_as_the_formula_says(widget, key, value, changes):
    at = open_page(PAGE)
    getattr(at, widget)(key=f"positional.{key}").set_value(value).run()
    assert not at.error
    check_code(at, **{**DEFAULTS, **changes})
    assert at.query_params[key] == str(value).removesuffix(".0")


def test_sentences_set_the_order_blindness_measurement():
    at = open_page(PAGE)
    at.text_input(key="positional.a").set_value("the cat saw the dog")
    at.text_input(key="positional.b").set_value("the dog saw the cat").run()
    assert not at.exception and not at.error
    a, b = "the cat saw the dog".split(), "the dog saw the cat".split()
    plain = positions.order_blindness(a, b, with_pe=False, backend="cpu")
    coded = positions.order_blindness(a, b, with_pe=True, backend="cpu")
    assert [m.value for m in at.metric] == [f"{plain.gap:.2e}", f"{coded.gap:.2e}"]
    assert float(at.metric[0].value) < 1e-12 < 0.1 < float(at.metric[1].value)


def test_bad_sentences_are_a_message():
    at = open_page(PAGE)
    at.text_input(key="positional.b").set_value("man bites cat").run()
    assert not at.exception and "same words" in at.error[0].value
    at.text_input(key="positional.b").set_value("man bites dog")
    at.text_input(key="positional.a").set_value(" ".join(["w"] * 17)).run()
    assert "at most 16" in at.error[0].value
    check_code(at, **DEFAULTS)                                         # the rest of the page still draws


def test_a_link_restores_the_controls_and_out_of_range_positions_are_clamped():
    at = open_page(PAGE, {"a": "a b c", "b": "c b a", "T": "12", "d": "7", "base": "500", "from": "40",
                          "k": "30", "Tc": "20", "Ts": "5"})
    assert not at.exception and not at.error
    warned = " ".join(w.value for w in at.warning)       # each value changed is named, with the one used
    assert all(f"{name}=“{raw}” in the link" in warned for name, raw in (("d", 7), ("from", 40), ("k", 30)))
    assert at.text_input(key="positional.a").value == "a b c"
    assert at.slider(key="positional.T").value == 12 and at.slider(key="positional.d").value == 6   # even
    assert at.number_input(key="positional.base").value == 500.0
    assert at.slider(key="positional.from").value == 11 and at.slider(key="positional.k").value == 11
    check_code(at, T=12, d=6, base=500.0, origin=11, k=11, Tc=20, Ts=5)
    at.slider(key="positional.T").set_value(20).run()
    assert at.query_params["T"] == "20" and at.query_params["base"] == "500"


def test_a_learned_table_trained_at_512_asked_for_1024_misses_512_rows_and_sinusoidal_has_them():
    at = open_page(PAGE)
    table = table_with(at, "code").set_index("code")
    assert table.loc["learned (trained at 512)", "rows it has"] == 512
    assert table.loc["learned (trained at 512)", "missing rows"] == 512
    assert table.loc["sinusoidal (formula)", "rows it has"] == 1024
    assert table.loc["sinusoidal (formula)", "missing rows"] == 0
    assert "positions 512 to 1023 (512 of the 1024 asked for) have no vector" in markdown(at)
    # the length of position 1023's vector: a word where the table has no row, never a raw None
    norms = table["|vector of position 1023|"]
    assert norms["learned (trained at 512)"] == "no such row"
    assert float(norms["sinusoidal (formula)"]) == pytest.approx(8.0, abs=1e-4)      # sqrt(d/2), d = 128
    at.number_input(key="positional.asked").set_value(300).run()       # within the table: nothing missing
    table = table_with(at, "code").set_index("code")
    assert table.loc["learned (trained at 512)", "missing rows"] == 0
    assert table["|vector of position 299|"].map(float).gt(0).all()
    assert "all 300 positions are within its 512 rows" in markdown(at)
    at.number_input(key="positional.trained").set_value(100).run()
    assert table_with(at, "code").set_index("code").loc["learned (trained at 100)", "missing rows"] == 200
