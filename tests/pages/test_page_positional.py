"""The Positional encoding page: order blindness measured, and every number of the sinusoidal
code (offset property, similarity curve, near collisions, RoPE scores) checked against the
formulas for each control."""
import re
from pathlib import Path

import numpy as np
import pytest

from core import positional
from core.lessons import positions, questions
from core.kernels import reference as ref

from page_support import answer_question, button, heatmap_grids, matrix_named, open_page

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
    assert headings == ["Does attention see the order of the words?", "The sinusoidal code",
                        "Other codes, seen in the scores"]
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


# --- predict, then see: reorder the words; the sentences that quote the page's numbers ------------


def gaps(at):
    return {m.label: float(m.value) for m in at.metric if m.label.startswith("gap ")}


def test_the_sentences_and_the_shuffle_wait_for_the_opening_question():
    q = questions.opening("positional")
    at = open_page(PAGE, answered=False)
    assert not at.exception
    assert at.text_input(key="positional.a").disabled and at.text_input(key="positional.b").disabled
    assert button(at, "Shuffle A's words into B").disabled
    assert gaps(at) == {} and "outputs are" not in markdown(at)
    assert not [t for grid in heatmap_grids(at) for t in grid if "PE)" in t]     # no outputs drawn yet
    assert any("answered the question" in i.value for i in at.info)
    answer_question(at, q, q.options[q.answer])
    assert not at.text_input(key="positional.b").disabled and not button(at, "Shuffle A's words into B").disabled
    assert set(gaps(at)) == {"gap without PE", "gap with sinusoidal PE"}


@pytest.mark.parametrize("a, b", [("dog bites man", "man bites dog"), ("the cat saw a dog", "a dog saw the cat")])
def test_the_opening_answer_is_what_the_page_shows(a, b):
    """Without positions B's outputs are A's, reordered as the words were: the two panels the page
    draws without PE match to rounding (and the gap says so); with PE they do not."""
    q = questions.opening("positional")
    at = open_page(PAGE, {"a": a, "b": b})
    without, with_pe = heatmap_grids(at)[:2]
    panels = list(without.values())
    np.testing.assert_allclose(panels[0], panels[1], rtol=0, atol=1e-12)
    assert gaps(at)["gap without PE"] < 1e-12
    reordered = np.allclose(panels[0], panels[1], rtol=0, atol=1e-12)
    assert q.options[q.answer].startswith("They are A's outputs, reordered" if reordered else "They are all different")
    coded = list(with_pe.values())
    assert np.abs(coded[0] - coded[1]).max() > 0.1
    later = questions.by_key("positional.no_positions")                 # the same fact, one question on
    assert "same bag of vectors" in later.options[later.answer]


def test_the_shuffle_button_reorders_a_s_words_into_b():
    at = open_page(PAGE)
    before = at.text_input(key="positional.b").value
    for _ in range(4):
        button(at, "Shuffle A's words into B").click().run()
        b = at.text_input(key="positional.b").value
        assert sorted(b.split()) == sorted("dog bites man".split()) and not at.error
        assert b not in ("dog bites man", before)                        # a new order at each click
        before = b
        assert at.query_params.get("b", "man bites dog") == b              # the link leaves out the default
        plain = positions.order_blindness("dog bites man".split(), b.split(), with_pe=False, backend="cpu")
        assert gaps(at)["gap without PE"] == pytest.approx(plain.gap, abs=1e-15) and plain.gap < 1e-12


@pytest.mark.parametrize("link", [{}, {"Tc": "40"}, {"Tc": "512", "base": "500"}])
def test_the_closest_call_quotes_the_table_and_is_not_called_indistinguishable(link):
    """The sentence under the near-collision table names the row whose distant pair is closest compared
    with two neighbours, with its numbers; the old sentence said such positions cannot be told apart,
    but their codes differ."""
    at = open_page(PAGE, link)
    Tc, base = int(link.get("Tc", 100)), float(link.get("base", 10000.0))
    pairs = table_with(at, "d_model")
    best = None
    for _, row in pairs.iterrows():
        if row["apart"] > 1:
            two = ref.sinusoidal(2, int(row["d_model"]), base)
            neighbours = np.linalg.norm(two[1] - two[0])
            if best is None or neighbours / row["distance"] > best[2]:
                best = (row, neighbours, neighbours / row["distance"])
    row, neighbours, ratio = best
    i, j = map(int, row["closest pair"].split(" and "))
    text = markdown(at)
    assert (f"at d_model = {row['d_model']}, positions {i} and {j}, {j - i} apart, have codes only "
            f"**{row['distance']:.3g}** apart (cosine {row['cosine']:.5f}), where two neighbouring positions' "
            f"codes are {neighbours:.3g} apart: **{ratio:.0f} times closer**") in text
    assert row["distance"] > 0 and "cannot tell them apart" not in text and "can still tell them apart" in text
    assert ref.sinusoidal(Tc, int(row["d_model"]), base).shape == (Tc, row["d_model"])


@pytest.mark.parametrize("d, stands", [(128, "stands out:"), (2, "barely stands out at this small d_model:")])
def test_the_learned_scores_sentence_quotes_the_diagonal_it_draws(d, stands):
    """The random learned code's scores: the page says what the map shows, a diagonal (each vector with
    itself) against small scores between positions, with the numbers of the map drawn; the old sentence
    said they have no structure, while at d_model = 128 the diagonal is 17 times the rest."""
    at = open_page(PAGE, {"d": str(d)})
    (maps,) = [g for g in heatmap_grids(at) if "learned (random init): P Pᵀ/√d" in g]
    S = maps["learned (random init): P Pᵀ/√d"]
    itself, other = np.diag(S).mean(), np.abs(S[~np.eye(len(S), dtype=bool)]).mean()
    text = markdown(at)
    assert (f"it {stands} |P_p|²/√d averages **{itself:.1e}** there, against **{other:.1e}** in size between "
            f"two different positions ({itself / other:.1f} times less)") in text
    assert "no structure" not in text
    assert (itself > 3 * other) == (d == 128)


@pytest.mark.parametrize("link", [{}, {"d": "4", "base": "500"}, {"d": "2"}])
def test_the_frequencies_are_defined_where_the_formula_is_and_quote_the_code(link):
    at = open_page(PAGE, link)
    d, base = int(link.get("d", 128)), float(link.get("base", 10000.0))
    omega = 1 / base ** (np.arange(0, d, 2) / d)
    PE = ref.sinusoidal(3, d, base)
    np.testing.assert_allclose(PE[1, 0::2], np.sin(omega), atol=1e-12)  # the ω the page defines is the code's
    latex = " ".join(e.value for e in at.latex)
    assert r"\omega_i = \frac{1}{b^{2i/d_{\text{model}}}}" in latex
    text = markdown(at)
    if d == 2:
        assert "Its one pair of columns (i = 0) turns at ω_0 = 1 radian per position." in text
    else:
        assert (f"Column pair i = 0 … {d // 2 - 1} turns at ω_i radians per position: from ω_0 = 1 "
                f"down to ω_{d // 2 - 1} = {omega[-1]:.3g}.") in text
