"""Every chart a page draws is the array it claims to show.

Each test opens a page through AppTest, reads the cells of its charts back from their Vega-Lite
specs (``page_support.charts``) and compares them with the array recomputed here, independently of
the page: from the lesson's functions with the page's settings and NumPy, or from a model's forward
cache. Where a chart could plausibly show its neighbour instead (a LayerNorm's input and its output,
the rollout and one layer's map, one head and another), the test also checks the two differ, so the
comparison can tell them apart. The settings are moved off their defaults (another head, layer,
example, row) so that a chart drawing the default's array fails too.
"""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.kernels import reference as ref
from core.lessons import heads, positions
from page_support import (bar_charts, charts, heatmap_grids, heatmaps, line_charts, named, open_page,
                          stem_charts)

VIEWS = Path(__file__).resolve().parents[2] / "views"
CLOSE = dict(rtol=1e-12, atol=1e-12)       # float64 pages: the same numbers up to rounding


def view(name: str) -> str:
    return str(VIEWS / f"{name}.py")


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """Row softmax in plain NumPy; a -inf score gets weight 0."""
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def causal(T: int) -> np.ndarray:
    return np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)


def masked_blank(S: np.ndarray) -> np.ndarray:
    """A score matrix as the charts draw it: masked (-inf) cells blank."""
    return np.where(np.isfinite(S), S, np.nan)


def assert_same_panels(shown: dict, want: dict) -> None:
    """A grid's panels are the ones named, in that order, each with the matrix given."""
    assert list(shown) == list(want)
    for title, matrix in want.items():
        np.testing.assert_allclose(shown[title], matrix, **CLOSE, err_msg=title)


def as_in_editor(M) -> np.ndarray:
    """A matrix as an editable table holds it, and so as the page uses it: 8 significant digits."""
    return np.vectorize(lambda x: float(f"{x:.8g}"), otypes=[float])(np.asarray(M, dtype=float))


def check(at) -> None:
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def chart_gallery():
    """A page of one chart of each kind, with known numbers (run by AppTest)."""
    import numpy as np
    import pandas as pd
    import streamlit as st

    from ui import charts as ch

    M = np.arange(6.0).reshape(2, 3)
    M[0, 1] = np.nan
    spec = ch.heatmap(M, ["r1", "r2"], ["a", "b", "c"], title="m")
    spec["data"]["values"].reverse()                     # cells in any order: the axes say where each goes
    st.vega_lite_chart(spec)
    st.vega_lite_chart(ch.heatmap(M.T, ["a", "b", "c"], ["r1", "r2"], title={"text": ["m", "transposed"]}))
    st.vega_lite_chart(ch.heatmap_grid([M, -M], ["r1", "r2"], ["a", "b", "c"], ["plus", "minus"]))
    st.vega_lite_chart(ch.bar([3.0, 1.0, 2.0], ["x", "y", "z"], title="b"))
    st.vega_lite_chart(ch.stem([0.5, 0.25], title="s"))
    st.vega_lite_chart(ch.lines(pd.DataFrame({"t": [1, 2], "v": [4.0, 5.0], "k": ["p", "q"]}), "t", "v", "k", title="l"))


def test_the_chart_reader_places_each_cell_by_its_axes():
    """The reader behind every test below: a heatmap's cells go where its axes put them, whatever
    their order in the data (so a chart drawn transposed reads transposed), a blank cell is NaN, a
    grid's panels come by panel, bars in their drawn order, stems by position, lines as plotted."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(chart_gallery).run()
    check(at)
    M = np.arange(6.0).reshape(2, 3)
    M[0, 1] = np.nan
    maps = heatmaps(at)
    assert list(maps) == ["m", "m transposed"]
    np.testing.assert_array_equal(maps["m"], M)
    np.testing.assert_array_equal(maps["m transposed"], M.T)
    (grid,) = heatmap_grids(at)
    assert list(grid) == ["plus", "minus"]
    np.testing.assert_array_equal(grid["minus"], -M)
    assert bar_charts(at)["b"].to_dict() == {"x": 3.0, "y": 1.0, "z": 2.0}
    assert stem_charts(at)["s"].to_dict() == {1: 0.5, 2: 0.25}
    pd.testing.assert_frame_equal(line_charts(at)["l"], pd.DataFrame({"t": [1, 2], "v": [4.0, 5.0], "k": ["p", "q"]}))
    assert [c.kind for c in charts(at)] == ["heatmap", "heatmap", "grid", "bars", "stem", "lines"]


# ----------------------------------------------------------------------------------------------
# One head
# ----------------------------------------------------------------------------------------------
def one_head_expected(tokens, *, seed=0, d_k=2, scaled=True, temperature=1.0, is_causal=True):
    """S and A of the page's drawn Q and K, computed here from the formula."""
    T = len(tokens)
    rng = np.random.default_rng(seed)
    Q, K = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k))
    scale = (1 / np.sqrt(d_k) if scaled else 1.0) / temperature
    S = Q @ K.T * scale + (causal(T) if is_causal else 0.0)
    return S, softmax_rows(S)


def test_one_head_charts_are_its_scores_and_weights():
    """Fails when a chart draws A transposed, S before the temperature or the mask, another query's
    row, or the two-position head's row of another query."""
    at = open_page(view("one_head"))
    check(at)
    tokens = "The tired cat sat on the warm mat".split()
    for settings in ({}, dict(seed=7, d_k=3, scaled=False, temperature=0.5, is_causal=False)):
        if settings:
            at.number_input(key="one_head.seed").set_value(7)
            at.number_input(key="one_head.d_k").set_value(3)
            at.toggle(key="one_head.scaled").set_value(False)
            at.slider(key="one_head.temperature").set_value(0.5)
            at.toggle(key="one_head.causal").set_value(False)
            at.slider(key="one_head.query").set_value(6)
            at.run()
            check(at)
        S, A = one_head_expected(tokens, **settings)
        maps = heatmaps(at)
        np.testing.assert_allclose(maps["Scores S (masked cells blank)"], masked_blank(S), **CLOSE)
        np.testing.assert_allclose(maps["Weights A = softmax(S)"], A, **CLOSE)
        q = 6 if settings else 4
        bars = bar_charts(at)
        np.testing.assert_allclose(named(bars, f"Weights of query {q} ").to_numpy(), A[q - 1], **CLOSE)
        # the head that asks for positions 1 and q - 1 at once, under the same mask, unscaled by τ
        d_k = settings.get("d_k", 2)
        Q2, K2 = heads.two_positions(len(tokens), d_k, heads.DEFAULT_GAIN, query=q, targets=(1, q - 1))
        S2 = Q2 @ K2.T / np.sqrt(d_k) + (causal(len(tokens)) if settings.get("is_causal", True) else 0.0)
        np.testing.assert_allclose(bars[f"Query {q} asks for positions 1 and {q - 1}"].to_numpy(),
                                   softmax_rows(S2)[q - 1], **CLOSE)


# ----------------------------------------------------------------------------------------------
# Multi-head, set by hand
# ----------------------------------------------------------------------------------------------
def test_multi_head_charts_are_each_heads_scores_and_weights():
    """Fails when the grid draws the heads out of order, the opened head's charts show another head
    (or the default head 4), a stem another row, or the scores lose their mask."""
    at = open_page(view("multi_head"))
    at.number_input(key="multi_head.H").set_value(5).run()
    at.slider(key="multi_head.g2").set_value(6.0)
    at.selectbox(key="multi_head.p3").set_value("nearby")
    at.selectbox(key="multi_head.open").set_value(2)
    at.slider(key="multi_head.row").set_value(3)
    at.run()
    check(at)
    T, d_k = 6, 2
    presets = [heads.LESSON_HEADS[0], heads.LESSON_HEADS[1], "nearby", heads.LESSON_HEADS[3], heads.LESSON_HEADS[0]]
    gains = [heads.DEFAULT_GAIN, 6.0, heads.DEFAULT_GAIN, heads.DEFAULT_GAIN, heads.DEFAULT_GAIN]
    S = np.stack([q @ k.T / np.sqrt(d_k) + causal(T)
                  for q, k in (heads.build_head(p, T, d_k, g) for p, g in zip(presets, gains))])   # (H, T, T)
    A = softmax_rows(S)
    (grid,) = heatmap_grids(at)
    assert_same_panels(grid, {f"Head {h + 1}: {heads.PRESETS[p].label}": A[h] for h, p in enumerate(presets)})
    maps = heatmaps(at)
    np.testing.assert_allclose(maps["Scores of head 2 (masked: blank)"], masked_blank(S[1]), **CLOSE)
    np.testing.assert_allclose(maps["Weights of head 2"], A[1], **CLOSE)
    assert not np.allclose(A[1], A[3])                         # head 2 is not the default head 4
    stems = stem_charts(at)
    np.testing.assert_allclose(named(stems, "Row 3: ").to_numpy(), A[1, 2], **CLOSE)
    assert list(named(stems, "Row 3: ").index) == list(range(1, T + 1))
    for h in range(5):
        np.testing.assert_allclose(named(stems, f"head {h + 1}: ").to_numpy(), A[h, 2], **CLOSE)


# ----------------------------------------------------------------------------------------------
# Concat, W_O and the filter bank
# ----------------------------------------------------------------------------------------------
def filter_bank_expected(W_V, W_O, *, gain=heads.DEFAULT_GAIN, is_causal=True):
    """The block's weights, Concat, O and each head's term A_h X W_V^h W_O^(h), from their factors."""
    pipe = heads.two_head_pipeline(gain=gain)
    X, H, d_v = pipe.X, 2, 2
    S = ref.split_heads(X @ pipe.W_Q, H) @ np.swapaxes(ref.split_heads(X @ pipe.W_K, H), -1, -2) / np.sqrt(2)
    A = softmax_rows(S + (causal(4) if is_causal else 0.0))                            # (H, T, T)
    concat = np.hstack([A[h] @ X @ W_V[:, h * d_v:(h + 1) * d_v] for h in range(H)])  # [O_1, O_2]
    terms = [A[h] @ X @ W_V[:, h * d_v:(h + 1) * d_v] @ W_O[h * d_v:(h + 1) * d_v] for h in range(H)]
    return concat, concat @ W_O, terms


def filter_bank_check(at, W_V, W_O, **settings):
    concat, output, terms = filter_bank_expected(np.asarray(W_V, float), np.asarray(W_O, float), **settings)
    maps = heatmaps(at)
    np.testing.assert_allclose(maps["W_O (H·d_v × d_model)"], W_O, **CLOSE)
    np.testing.assert_allclose(maps["Concat = [O_1, O_2]"], concat, **CLOSE)
    np.testing.assert_allclose(maps["O = Concat · W_O"], output, **CLOSE)
    (grid,) = heatmap_grids(at)
    assert_same_panels(grid, {"head 1: A_1 X W_V^1 W_O^(1)": terms[0], "head 2: A_2 X W_V^2 W_O^(2)": terms[1],
                              "sum of the terms": terms[0] + terms[1], "Concat · W_O": output})
    return maps


def test_filter_bank_charts_are_the_block_and_its_terms():
    """Fails when a chart draws W_O transposed, Concat for O, a head's term with the other head's W_O
    rows, or the sum of the terms as one term: every chart is recomputed here from A, X, W_V, W_O."""
    at = open_page(view("filter_bank"))
    check(at)
    pipe = heads.two_head_pipeline()
    maps = filter_bank_check(at, pipe.W_V, heads.output_projection("lesson_mixing", 2, 2, seed=0))
    np.testing.assert_allclose(maps[""], pipe.W_V, **CLOSE)                 # the W_V heatmap (untitled)
    at.selectbox(key="filter_bank.wv").set_value("random")
    at.selectbox(key="filter_bank.wo").set_value("random")
    at.number_input(key="filter_bank.seed").set_value(3)
    at.slider(key="filter_bank.gain").set_value(2.0)
    at.toggle(key="filter_bank.causal").set_value(False)
    at.run()
    check(at)
    W_V = np.random.default_rng(3).normal(size=(4, 4))                    # the page's seeded draw
    W_O = as_in_editor(heads.output_projection("random", 2, 2, seed=3))
    maps = filter_bank_check(at, W_V, W_O, gain=2.0, is_causal=False)
    np.testing.assert_allclose(maps[""], W_V, **CLOSE)


def test_filter_bank_reconstruction_error_compares_the_terms_with_the_output():
    """The metric is max |Σ_h term_h − Concat·W_O| of the two sides the page draws. For each W_O typed
    into the page's editor, both sides move with it (checked against the factors), stay equal to
    rounding, and the metric is their difference as written, which is not 0 for every W_O: a metric
    computed as the output minus itself (always exactly 0), or the sum against itself, fails."""
    at = open_page(view("filter_bank"))
    pipe = heads.two_head_pipeline()
    rng = np.random.default_rng(11)
    before, shown = None, []
    for _ in range(6):
        W_O = np.round(rng.normal(size=(4, 4)) / 3, 4)      # as the editor shows it
        at.session_state["filter_bank.WO.typed"] = W_O.tolist()
        at.run()
        check(at)
        filter_bank_check(at, pipe.W_V, W_O)
        (grid,) = heatmap_grids(at)
        total, output = grid["sum of the terms"], grid["Concat · W_O"]
        if before is not None:
            assert np.abs(total - before).max() > 1e-3                    # the sides move with W_O
        before = total
        gap = np.abs(total - output).max()
        assert gap < 1e-12
        (metric,) = [m for m in at.metric if m.label == "max |Σ_h term_h − Concat·W_O|"]
        assert metric.value == f"{gap:.2e}"
        shown.append(gap)
    assert max(shown) > 0, "no W_O here shows a rounding-level difference: pick others"


# ----------------------------------------------------------------------------------------------
# Parameters and cost
# ----------------------------------------------------------------------------------------------
def test_parameters_charts_are_the_packed_projection_and_the_counts():
    """Fails when the packed W_Q is drawn transposed or with its heads' blocks swapped, when a curve
    leaves out a divisor of d_model or plots d_model·H for d_k, when the count ignores the biases, or
    when a sublayer's bar holds another's count."""
    at = open_page(view("parameters"))
    at.slider(key="parameters.d_model").set_value(96)
    at.checkbox(key="parameters.ff_auto").set_value(False)
    at.run()
    at.slider(key="parameters.d_ff").set_value(200)
    at.checkbox(key="parameters.bias").set_value(True)
    at.run()
    check(at)
    d, d_ff = 96, 200
    # X = I: each head's queries are its own W_Q^h, and the packed matrix holds them side by side
    packed = np.hstack([heads.self_position(4, 2)[0], heads.uniform(4, 2)[0]])
    np.testing.assert_allclose(named(heatmaps(at), "Packed W_Q"), packed, **CLOSE)
    divisors = [h for h in range(1, 65) if d % h == 0]
    curves = line_charts(at)
    d_k = curves["d_k = d_model / H"]
    assert list(d_k["H"]) == divisors and list(d_k["value"]) == [d / h for h in divisors]
    flat = curves["parameters (flat)"]
    assert list(flat["H"]) == divisors and set(flat["value"]) == {4 * d * d + 4 * d}
    bars = bar_charts(at)["parameters per sublayer"]
    assert bars.to_dict() == {"attention": 4 * d * d + 4 * d, "FFN": 2 * d * d_ff + d_ff + d, "LayerNorms": 2 * 2 * d}


# ----------------------------------------------------------------------------------------------
# Positional encoding
# ----------------------------------------------------------------------------------------------
def sinusoid(T: int, d: int, base: float = 10000.0) -> np.ndarray:
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)), written out here."""
    PE = np.zeros((T, d))
    for p in range(T):
        for i in range(0, d, 2):
            PE[p, i] = np.sin(p / base ** (i / d))
            if i + 1 < d:
                PE[p, i + 1] = np.cos(p / base ** (i / d))
    return PE


def cosines(P: np.ndarray) -> np.ndarray:
    unit = P / np.linalg.norm(P, axis=1, keepdims=True)
    return unit @ unit.T


def rotate(x: np.ndarray, p: int, base: float) -> np.ndarray:
    """RoPE: feature pair (2i, 2i+1) turned by the angle p · base^(-2i/d)."""
    out = x.copy()
    for i in range(0, len(x), 2):
        a = p * base ** (-i / len(x))
        out[i], out[i + 1] = x[i] * np.cos(a) - x[i + 1] * np.sin(a), x[i] * np.sin(a) + x[i + 1] * np.cos(a)
    return out


def test_positional_charts_are_the_codes_and_their_measures():
    """Fails when the PE heatmap is drawn transposed or with another base, the cosine curve reads
    another row, the offset curves use another k or lose their normalisation, the longer-than-trained
    rows start elsewhere, RoPE's scores skip the rotation of the keys, or ALiBi's heads swap slopes."""
    at = open_page(view("positional"))
    at.slider(key="positional.T").set_value(40)
    at.slider(key="positional.d").set_value(32)
    at.number_input(key="positional.base").set_value(100.0)
    at.run()
    at.slider(key="positional.from").set_value(7)
    at.slider(key="positional.k").set_value(3)
    at.slider(key="positional.Ts").set_value(6)
    at.number_input(key="positional.trained").set_value(20)
    at.number_input(key="positional.asked").set_value(30)
    at.run()
    check(at)
    T, d, base, Ts = 40, 32, 100.0, 6
    PE = sinusoid(T, d, base)
    maps = heatmaps(at)
    np.testing.assert_allclose(maps["PE (positions × dimensions)"], PE, **CLOSE)
    np.testing.assert_allclose(maps["cosine similarity between positions"], cosines(PE), **CLOSE)
    curves = line_charts(at)
    cosine = curves["cosine similarity to position 7"]
    assert list(cosine["position"]) == list(range(T))
    np.testing.assert_allclose(cosine["cosine"], cosines(PE)[7], **CLOSE)
    dots = curves["PE_p · PE_(p+3) / mean |PE|², for every p"]
    learned = positions.learned(T, d, seed=0)                       # the page's untrained table
    for code, P in (("sinusoidal", PE), ("learned (random init)", learned)):
        curve = dots[dots["code"] == code]
        want = np.einsum("pi,pi->p", P[:-3], P[3:]) / np.mean((P ** 2).sum(axis=1))
        assert list(curve["p"]) == list(range(T - 3))
        np.testing.assert_allclose(curve["dot"], want, **CLOSE, err_msg=code)
    blind, coded, longer, scores, alibi = heatmap_grids(at)
    # learned rows exist up to the trained length (blank after); the formula gives every row
    lo, hi = 20 - 8, 28
    rows = np.full((hi - lo, 16), np.nan)
    rows[:20 - lo] = positions.learned(20, d, seed=0)[lo:, :16]
    assert_same_panels(longer, {f"learned: rows {lo}–{hi - 1} (blank: no row)": rows,
                                f"sinusoidal: rows {lo}–{hi - 1}": sinusoid(30, d, base)[lo:hi, :16]})
    P_sin, P_learned = sinusoid(Ts, d, base), positions.learned(Ts, d, seed=0)
    assert_same_panels(scores, {"sinusoidal: P Pᵀ/√d": P_sin @ P_sin.T / np.sqrt(d),
                                "learned (random init): P Pᵀ/√d": P_learned @ P_learned.T / np.sqrt(d)})
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=8), rng.normal(size=8)
    rope = np.array([[rotate(q, m, base) @ rotate(k, n, base) / np.sqrt(8) for n in range(Ts)] for m in range(Ts)])
    np.testing.assert_allclose(maps["RoPE scores, same q and k everywhere"], rope, **CLOSE)
    distance = np.abs(np.arange(Ts)[:, None] - np.arange(Ts)[None, :])
    slopes = [2.0 ** (-8 * h / 4) for h in range(1, 5)]
    assert_same_panels(alibi, {f"head {h + 1}: slope {m:.3f}": masked_blank(-m * distance + causal(Ts))
                               for h, m in enumerate(slopes)})


def test_positional_order_blindness_charts_are_the_outputs_in_b_s_order():
    """Fails when A's outputs are drawn in A's own order (not B's) or one panel repeats the other:
    without positions A's outputs, reordered, are B's outputs; with positions they are not, and each
    panel is the lesson's layer output on its own sentence."""
    at = open_page(view("positional"))
    at.text_input(key="positional.a").set_value("the cat saw a dog")
    at.text_input(key="positional.b").set_value("a dog saw the cat")
    at.run()
    check(at)
    a, b = "the cat saw a dog".split(), "a dog saw the cat".split()
    order = [a.index(w) for w in b]                                  # B's word i is A's word order[i]
    blind, coded = heatmap_grids(at)[:2]
    for grid, with_pe, name in ((blind, False, "without PE"), (coded, True, "with PE")):
        run = positions.order_blindness(a, b, with_pe=with_pe)
        assert_same_panels(grid, {f"A's outputs, in B's order ({name})": run.outputs_a[order],
                                  f"B's outputs ({name})": run.outputs_b})
    np.testing.assert_allclose(*blind.values(), atol=1e-12)
    assert np.abs(np.subtract(*coded.values())).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# Masks and cross-attention
# ----------------------------------------------------------------------------------------------
def masks_layer(d: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0 / np.sqrt(d), (d, d)) for _ in range(4)]


def masks_embed(words, d: int, seed: int) -> np.ndarray:
    table = {w: np.random.default_rng([seed, *map(ord, w)]).normal(size=d) for w in set(words)}
    return np.stack([table[w] for w in words]) + sinusoid(len(words), d)


def test_masks_charts_are_each_masks_weights():
    """Fails when a grid draws the unmasked weights for the causal panel, another head than head 1
    of each padded sequence, one sequence's weights for another, or cross-attention transposed."""
    at = open_page(view("masks"))
    at.text_input(key="masks.sentence").set_value("a cat sat on a mat")
    at.toggle(key="masks.mask").set_value(True)
    at.text_input(key="masks.lengths").set_value("5, 2, 4")
    at.slider(key="masks.T").set_value(5)
    at.select_slider(key="masks.heads").set_value("4")
    at.checkbox(key="masks.causal").set_value(True)
    at.text_input(key="masks.source").set_value("le chat noir dort")
    at.text_input(key="masks.target").set_value("the black cat")
    at.run()
    check(at)
    d = 8
    free_grid, pad_grid, cross_grid = heatmap_grids(at)
    words = "a cat sat on a mat".split()
    X = masks_embed(words, d, seed=1)
    W = masks_layer(d, 0)
    free = ref.multi_head_attention(X, *W, 1)["weights"][0]
    masked = ref.multi_head_attention(X, *W, 1, causal(len(words)))["weights"][0]
    assert_same_panels(free_grid, {"no mask": free, "causal mask": masked})
    lengths, T = [5, 2, 4], 5
    Xb = np.random.default_rng(2).normal(size=(3, T, d))
    mask = np.where(np.arange(T)[None, None, :] < np.array(lengths)[:, None, None], 0.0, -np.inf) + causal(T)
    A = ref.multi_head_attention(Xb, *masks_layer(d, 0), 4, mask)["weights"]          # (B, H, T, T)
    assert not np.allclose(A[:, 0], A[:, 1])                                          # head 1 is not head 2
    assert_same_panels(pad_grid, {f"sequence {b + 1}: length {n}": A[b, 0] for b, n in enumerate(lengths)})
    src, tgt = "le chat noir dort".split(), "the black cat".split()
    cross = ref.multi_head_attention(masks_embed(tgt, d, seed=4), *masks_layer(d, 5), 2,
                                     X_kv=masks_embed(src, d, seed=3))["weights"]     # (H, 3, 4)
    assert_same_panels(cross_grid, {"head 1": cross[0], "head 2": cross[1]})


# ----------------------------------------------------------------------------------------------
# A real model
# ----------------------------------------------------------------------------------------------
REAL_MODEL = view("real_model")
GPT_TEXT = "the query and the key give a score. the query and the key give"
SHIPPED_GPT = str(Path(__file__).resolve().parents[2] / "core" / "model" / "tiny_gpt")
F32 = dict(rtol=0, atol=2e-5)            # the page runs a real model in float32


def rollout_by_hand(W: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema's rollout through every layer: Ā_L ··· Ā_1, Ā = rownorm(½ mean_h A + ½ I)."""
    T = W.shape[-1]
    R = np.eye(T)
    for layer in W:                                    # the latest layer multiplies on the left
        mixed = 0.5 * layer.mean(axis=0) + 0.5 * np.eye(T)
        R = mixed / mixed.sum(axis=1, keepdims=True) @ R
    return R


def first_layer_mixed(W: np.ndarray) -> np.ndarray:
    mixed = 0.5 * W[0].mean(axis=0) + 0.5 * np.eye(W.shape[-1])
    return mixed / mixed.sum(axis=1, keepdims=True)


def real_model_maps(at, W: np.ndarray, layer: int, head: int) -> None:
    """The grid, the chosen head's map, the last layer's mean and the rollout are the weights ``W``
    (L, H, T, T) of the text, computed here."""
    L, H, T, _ = W.shape
    n = min(T, 16)
    (grid,) = heatmap_grids(at)
    assert_same_panels_f32(grid, {f"L{l + 1}H{h + 1}": W[l, h, :n, :n] for l in range(L) for h in range(H)})
    maps = heatmaps(at)
    np.testing.assert_allclose(named(maps, f"L{layer + 1}H{head + 1}: "), W[layer, head], **F32)
    assert np.abs(W[layer, head] - W[0, 0]).max() > 1e-2                      # not the default head
    np.testing.assert_allclose(maps["Last layer, mean over heads"], W[-1].mean(axis=0), **F32)
    R = rollout_by_hand(W)
    np.testing.assert_allclose(maps["Rollout through every layer"], R, **F32)
    # the rollout is neither the first layer's map nor the layers multiplied the other way round
    assert np.abs(R - first_layer_mixed(W)).max() > 1e-2
    assert np.abs(R - rollout_by_hand(W[::-1])).max() > 1e-2


def assert_same_panels_f32(shown: dict, want: dict) -> None:
    assert list(shown) == list(want)
    for title, matrix in want.items():
        np.testing.assert_allclose(shown[title], matrix, **F32, err_msg=title)


def test_real_model_charts_are_the_decoders_weights_rollout_and_scores():
    """On the shipped small GPT: fails when the rollout chart draws the first layer's map, or its
    layers multiplied in the reverse order; when the chosen head's map is another head's or layer's;
    when the grid's panels are out of order; or when a detector chart is drawn transposed or from the
    wrong offset. Everything is recomputed here with the readable transformer in float64."""
    from core import pretrained
    from core.lessons import real_model as rm
    from core.model import transformer as tr

    at = open_page(REAL_MODEL, {"which": "tiny_gpt", "text": GPT_TEXT})
    at.number_input(key="real_model.layer").set_value(2)
    at.number_input(key="real_model.head").set_value(3)
    at.run()
    check(at)
    m = pretrained.load(SHIPPED_GPT)
    cfg, params = m.config, {k: np.asarray(v, np.float64) for k, v in m.params.items()}
    ids = m.encode(GPT_TEXT)[:cfg.n_ctx]
    _, cache = tr.forward(params, cfg, ids[None])
    W = np.stack([cache[f"blocks.{l}.attn.weights"][0] for l in range(cfg.n_layers)])        # (L, H, T, T)
    real_model_maps(at, W, 1, 2)
    # the detector: mean attention on n random ids repeated once, after a first token
    n = min(20, cfg.n_ctx // 2 - 1)
    seq = rm.repeated_random_tokens(cfg.vocab_size, n, batch=4, seed=0, first=m.token_id("<|endoftext|>"))
    _, cache = tr.forward(params, cfg, seq)
    A = np.stack([cache[f"blocks.{l}.attn.weights"] for l in range(cfg.n_layers)])           # (L, B, H, T, T)
    t = np.arange(1, 2 * n + 1)
    second = np.arange(1 + n, 1 + 2 * n)
    want = {"previous-token score": A[..., t, t - 1].mean(axis=(1, 3)),
            "duplicate-token score": A[..., second, second - n].mean(axis=(1, 3)),
            "induction score": A[..., second, second - n + 1].mean(axis=(1, 3)),
            "first-token score": A[..., :, 0].mean(axis=(1, 3))}
    maps = heatmaps(at)
    for title, scores in want.items():
        np.testing.assert_allclose(maps[title], scores, **F32, err_msg=title)


@pytest.fixture(scope="module")
def minilm():
    from core.model import minilm_package
    from core import pretrained
    try:
        return pretrained.load(minilm_package.MINILM)
    except ValueError as err:
        pytest.skip(f"all-MiniLM-L6-v2 is not installed: {err}")


def sentence_embedding(m, text, ablate=None) -> np.ndarray:
    """One sentence alone (no padding): the mean of its last hidden states, unit length."""
    hidden, _ = m.forward(m.encode(text)[None], ablate=ablate)
    e = hidden[0].astype(np.float64).mean(axis=0)
    return e / np.linalg.norm(e)


def test_real_model_charts_are_the_encoders_weights_scores_and_similarities(minilm):
    """On all-MiniLM-L6-v2 (the page's default): the maps and the rollout as for the decoder; each
    detector chart is its formula on the text's weights; the similarity charts are the cosines of the
    sentences' mean-pooled embeddings, each sentence run alone, with and without the head (zeroed, then
    replaced by its mean over the sentence's tokens)."""
    m = minilm
    text = "The quick brown fox jumps over the lazy dog."
    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    at = open_page(REAL_MODEL, {"text": text})
    at.number_input(key="real_model.layer").set_value(3)
    at.number_input(key="real_model.head").set_value(5)
    at.run()
    check(at)
    ids = m.encode(text)
    _, cache = m.forward(ids[None])
    W = np.stack([cache[f"blocks.{l}.attn.weights"][0] for l in range(m.config.n_layers)]).astype(np.float64)
    real_model_maps(at, W, 2, 4)
    T = W.shape[-1]
    t = np.arange(T)
    entropy = -np.sum(np.where(W > 0, W * np.log2(np.where(W > 0, W, 1)), 0), axis=-1)   # (L, H, T) bits
    want = {"previous-token score": W[..., t[1:], t[1:] - 1].mean(-1), "next-token score": W[..., t[:-1], t[:-1] + 1].mean(-1),
            "[CLS] sink score": W[..., :, 0].mean(-1), "[SEP] sink score": W[..., :, -1].mean(-1),
            "broad score": entropy.mean(-1) / np.log2(T)}
    maps = heatmaps(at)
    for title, scores in want.items():
        np.testing.assert_allclose(maps[title], scores, **F32, err_msg=title)
    E = np.stack([sentence_embedding(m, s) for s in sentences])
    np.testing.assert_allclose(maps["Cosine similarity"], E @ E.T, **F32)
    E2 = np.stack([sentence_embedding(m, s, {(2, 4): "zero"}) for s in sentences])
    np.testing.assert_allclose(maps["Without L3H5"], E2 @ E2.T, **F32)
    np.testing.assert_allclose(maps["After − before"], E2 @ E2.T - E @ E.T, **F32)
    assert np.abs(E2 @ E2.T - E @ E.T).max() > 1e-4                           # removing the head moves them
    # the head's output replaced by its mean: over each sentence's own tokens, as when it runs alone,
    # though the page runs the sentences as one padded batch
    at.radio(key="real_model.how").set_value("mean").run()
    check(at)
    E3 = np.stack([sentence_embedding(m, s, {(2, 4): "mean"}) for s in sentences])
    maps = heatmaps(at)
    np.testing.assert_allclose(maps["Without L3H5"], E3 @ E3.T, **F32)
    np.testing.assert_allclose(maps["After − before"], E3 @ E3.T - E @ E.T, **F32)
    assert np.abs(E3 @ E3.T - E2 @ E2.T).max() > 1e-4                          # the mean is not the zero


# ----------------------------------------------------------------------------------------------
# Inside a trained model
# ----------------------------------------------------------------------------------------------
def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def test_inside_model_charts_are_the_named_cache_entries():
    """Layer 2 of test example 3: each walkthrough chart is the cache entry it names and the post-norm
    block's formula from the charts before it. Fails when the chart titled as LayerNorm 1's input
    (r₁ = x + MHA(x)) draws its output, when any chart draws layer 1's or example 0's arrays, when the
    heads' grid is another layer's, when the head's mean map is another head's, or when a gain, bias
    or the pooled vector is another's."""
    import test_page_inside_model as inside_page
    from core.lessons import inside

    at = inside_page.page({"example": "3", "layer": "2", "show": "L2H3"})
    check(at)
    m = inside_page.model()
    p, eps = m.params, m.cfg.ln_eps
    tokens = m.data.X_test[3]
    _, cache = inside.forward(p, m.cfg, tokens[None])
    c = {name: value[0] for name, value in cache.items() if name != "pos_embed"}
    blk = lambda name: c[f"blocks.1.{name}"]               # noqa: E731  layer 2's entries
    par = lambda name: p[f"blocks.1.{name}"]               # noqa: E731
    tol = dict(rtol=1e-6, atol=1e-6)                      # the model's own float32 arithmetic
    maps = heatmaps(at)
    np.testing.assert_allclose(maps["token embeddings E[tok_t]"], p["embed"][tokens], **tol)
    np.testing.assert_allclose(maps["E[tok_t] + PE_t"], p["embed"][tokens] + sinusoid(len(tokens), m.cfg.d_model),
                               rtol=1e-5, atol=1e-5)
    h = blk("resid_pre")
    np.testing.assert_allclose(h, c["blocks.0.resid_post"], **tol)            # layer 2 reads layer 1's output
    np.testing.assert_allclose(maps["concat"], blk("attn.concat"), **tol)
    np.testing.assert_allclose(maps["MHA(x)"], blk("attn.concat") @ par("attn.W_O") + par("attn.b_O"), **tol)
    r1 = h + blk("attn.output")
    x = layer_norm(r1, par("ln1.g"), par("ln1.b"), eps)
    np.testing.assert_allclose(maps["r₁ = x + MHA(x)"], r1, **tol)
    np.testing.assert_allclose(maps["LN₁(r₁)"], x, rtol=1e-5, atol=1e-5)
    assert np.abs(r1 - x).max() > 0.1                                           # input and output differ
    hidden = np.maximum(x @ par("ffn.W_1") + par("ffn.b_1"), 0)
    np.testing.assert_allclose(maps["relu(x W₁ + b₁)"], hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(maps["FFN(x)"], blk("ffn.output"), **tol)
    r2 = blk("resid_mid") + blk("ffn.output")
    np.testing.assert_allclose(maps["r₂ = x + FFN(x)"], r2, **tol)
    np.testing.assert_allclose(maps["the output of layer 2"], layer_norm(r2, par("ln2.g"), par("ln2.b"), eps),
                               rtol=1e-5, atol=1e-5)
    assert np.abs(r2 - blk("resid_post")).max() > 0.1
    grid, pair = heatmap_grids(at)
    assert_same_panels_f32(grid, {f"head {i + 1}": blk("attn.weights")[i] for i in range(m.cfg.n_heads)})
    assert np.abs(blk("attn.weights") - c["blocks.0.attn.weights"]).max() > 1e-2   # layer 2 is not layer 1
    # the head shown beside the ablation table: its map averaged over the test set
    _, test_cache = inside.forward(p, m.cfg, m.data.X_test)
    mean_map = test_cache["blocks.1.attn.weights"][:, 2].astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(maps["L2H3: mean map over the test set"], mean_map, **tol)
    assert np.abs(mean_map - test_cache["blocks.1.attn.weights"][:, 0].mean(axis=0)).max() > 1e-3
    # layer 1, averaged over the heads, for test examples 0 and 5
    want = [test_cache["blocks.0.attn.weights"][i].astype(np.float64).mean(axis=0) for i in (0, 5)]
    assert [title.split(" (")[0] for title in pair] == ["Example A", "Example B"]
    for shown, w in zip(pair.values(), want):
        np.testing.assert_allclose(shown, w, **tol)
    # the bars, in page order: LayerNorm 1's gain and bias, LayerNorm 2's, the pooled vector
    bars = [chart.data.to_numpy() for chart in charts(at) if chart.kind == "bars"]
    final = test_cache["blocks.1.resid_post"][3].astype(np.float64)
    for shown, want in zip(bars[:5], [par("ln1.g"), par("ln1.b"), par("ln2.g"), par("ln2.b"), final.mean(axis=0)]):
        np.testing.assert_allclose(shown, want, **tol)
    # the change in test accuracy with each head removed, and the accuracy reading one position alone
    np.testing.assert_allclose(bars[5], inside_page.report().change("zero").ravel(), **CLOSE)
    logits = test_cache["blocks.1.resid_post"] @ p["classifier.W"] + p["classifier.b"]       # (n, T, C)
    np.testing.assert_allclose(bars[6], (logits.argmax(-1) == m.data.y_test[:, None]).mean(axis=0), **CLOSE)


# ----------------------------------------------------------------------------------------------
# Decoder and generation (untrained weights, seed 0: the page's until a run ends)
# ----------------------------------------------------------------------------------------------
def test_decoder_charts_are_the_generation_step_and_the_teacher_forced_maps():
    """Generation step 5, layer 2, head 3 of the reverse task's validation example 4. The attention rows
    and the K and V caches must be those of a teacher-forced pass over the tokens read so far (not of
    another step, layer or head, nor transposed); the bars softmax(z/τ) of that pass's last logits; the
    positions curves P, 1, 1, ... with the cache and P, P + 1, ... without; the grid each head's
    teacher-forced cross-attention of the example."""
    import test_page_decoder as decoder_page
    from core.model import decoder, generation
    from core.training.decoder_runs import build

    at = decoder_page.page()
    at.run()
    at.number_input(key="decoder.example").set_value(4)
    at.number_input(key="decoder.temperature").set_value(0.7)
    at.run()
    at.slider(key="decoder.step").set_value(5)
    at.selectbox(key="decoder.layer").set_value(2)
    at.selectbox(key="decoder.head").set_value(3)
    at.run()
    check(at)
    setup = build("reverse")
    cfg = setup.cfg
    params = {k: np.asarray(v, np.float64) for k, v in decoder.init_params(cfg, seed=0).items()}
    tgt_in, _, src = (a[4] for a in setup.val_arrays())
    n = cfg.decoder.n_ctx
    gen = generation.generate(params, cfg, src, max_new_tokens=n, temperature=0.7, seed=0)   # the tokens written
    P, j = gen.prompt_len, 4
    read = gen.tokens[:P + j]
    logits, cache = decoder.forward(params, cfg, read, src)                     # teacher-forced, no KV cache
    maps = heatmaps(at)
    self_row = cache["dec.blocks.1.attn.weights"][0, :, -1]                     # (H, P + j)
    np.testing.assert_allclose(maps["Causal self-attention of the new query, layer 2"], self_row, atol=1e-12)
    np.testing.assert_allclose(maps["Cross-attention of the new query, layer 2"],
                               cache["dec.blocks.1.cross.weights"][0, :, -1], atol=1e-12)
    assert np.abs(cache["dec.blocks.1.cross.weights"][0, :, -1] - cache["dec.blocks.0.cross.weights"][0, :, -1]).max() > 1e-3
    for name in ("K", "V"):
        rows = cache[f"dec.blocks.1.attn.{name.lower()}"][0, 2]                # (P + j, d_k), head 3
        np.testing.assert_allclose(maps[f"{name} cache, layer 2, head 3: {P + j} rows"], rows, atol=1e-12)
    z = logits[-1] / 0.7
    bars = bar_charts(at)["Next-token distribution at step 5 (τ = 0.7)"]
    np.testing.assert_allclose(bars.to_numpy(), np.exp(z - z.max()) / np.exp(z - z.max()).sum(), atol=1e-12)
    per_step = line_charts(at)["Positions run through the decoder at each step"]
    steps = np.arange(1, n + 1)
    want = pd.DataFrame({"step": np.tile(steps, 2), "positions": np.r_[[P] + [1] * (n - 1), P + steps - 1],
                         "generation": ["with the KV cache"] * n + ["full recompute"] * n})
    pd.testing.assert_frame_equal(per_step, want, check_dtype=False)
    (grid,) = heatmap_grids(at)
    _, forced = decoder.forward(params, cfg, tgt_in, src)
    assert_same_panels(grid, {f"layer {l + 1}, head {h + 1}": forced[f"dec.blocks.{l}.cross.weights"][0, h]
                              for l in range(2) for h in range(cfg.decoder.n_heads)})


def test_decoder_language_model_grid_is_its_causal_self_attention():
    """The character model's grid: each head's teacher-forced self-attention on validation window 2,
    layer by layer (fails when the grid draws the layers or heads out of order, or another window)."""
    import test_page_decoder as decoder_page
    from core.model import decoder
    from core.training.decoder_runs import build

    at = decoder_page.page()
    at.run()
    at.selectbox(key="decoder.task").set_value("lm").run()
    at.number_input(key="decoder.example").set_value(2).run()
    check(at)
    setup = build("lm")
    params = {k: np.asarray(v, np.float64) for k, v in decoder.init_params(setup.cfg, seed=0).items()}
    window = setup.val_arrays()[0][2]
    _, cache = decoder.forward(params, setup.cfg, window)
    (grid,) = heatmap_grids(at)
    want = {f"layer {l + 1}, head {h + 1}": cache[f"blocks.{l}.attn.weights"][0, h]
            for l in range(setup.cfg.n_layers) for h in range(setup.cfg.n_heads)}
    assert_same_panels(grid, want)


# ----------------------------------------------------------------------------------------------
# Induction heads
# ----------------------------------------------------------------------------------------------
def test_induction_charts_are_the_held_out_maps_scores_and_losses():
    """Held-out sequence 4, layer 1, head 2. Fails when a map is another sequence's, layer's or head's,
    when the loss curve is the training loss, counts positions from 0 or sorts the next tokens into
    the wrong kind, or when a score's bars are the other score's. The maps, the previous-token scores
    and the losses are recomputed from a teacher-forced pass of the same model over the held-out
    sequences, the kinds of next token from the tokens by a loop."""
    import test_page_induction as induction_page
    from core.model import decoder
    from core.lessons import head_kinds
    from core.lessons import induction as I

    at = induction_page._open(example=4, layer=1, head=2)
    check(at)
    setup = I.InductionSetup(steps=induction_page.STEPS)
    run = I.train_induction(setup, seed=0)
    tgt_in, tgt_out = I.held_out(setup, 0)
    logits, cache = decoder.forward(run.params, run.cfg, tgt_in)
    A = np.stack([cache[f"blocks.{l}.attn.weights"] for l in range(2)]).astype(np.float64)   # (L, B, H, T, T)
    tol = dict(rtol=1e-5, atol=1e-6)
    T = tgt_in.shape[1]
    previous = A[..., np.arange(1, T), np.arange(T - 1)].mean(axis=(1, 3))                  # (L, H)
    induction = head_kinds.induction(A.transpose(0, 2, 1, 3, 4), tgt_in)                  # (L, H)
    maps = heatmaps(at)
    prev_head, ind_head = int(np.argmax(previous[0])), int(np.argmax(induction[1]))
    np.testing.assert_allclose(named(maps, f"Layer 1, head {prev_head + 1}: "), A[0, 4, prev_head], **tol)
    np.testing.assert_allclose(named(maps, f"Layer 2, head {ind_head + 1}: "), A[1, 4, ind_head], **tol)
    np.testing.assert_allclose(maps["Layer 1, head 2"], A[0, 4, 1], **tol)
    assert np.abs(A[0, 4, 1] - A[1, 4, 0]).max() > 1e-2                  # not the default layer 2, head 1
    bars = bar_charts(at)
    heads_ = [f"L{l}H{h}" for l in (1, 2) for h in range(1, A.shape[2] + 1)]
    assert list(bars["Previous-token score"].index) == heads_
    np.testing.assert_allclose(bars["Previous-token score"], previous.ravel(), **tol)
    np.testing.assert_allclose(bars["Induction score"], induction.ravel(), **tol)
    z = logits.astype(np.float64)
    log_p = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    loss = -np.take_along_axis(log_p, tgt_out[..., None], axis=-1)[..., 0]                  # (B, T)
    kind = np.full(tgt_in.shape, "", dtype=object)
    for b in range(len(tgt_in)):
        seq = [int(tgt_in[b, 0])] + tgt_out[b].tolist()
        for t in range(T):
            if seq[t + 1] not in seq[:t + 1]:
                kind[b, t] = "first occurrence"
            elif any(seq[i] == seq[t] and seq[i + 1] == seq[t + 1] for i in range(t)):
                kind[b, t] = "repeated segment"
    curve = line_charts(at)["Mean loss per position (held-out)"]
    for name in ("first occurrence", "repeated segment"):
        drawn = curve[curve["next token"] == name]
        where = kind == name
        positions = np.flatnonzero(where.any(axis=0))
        assert list(drawn["query position"]) == list(positions + 1), name                    # counted from 1
        want = [loss[where[:, t], t].mean() for t in positions]
        np.testing.assert_allclose(drawn["loss"], want, **tol, err_msg=name)


# ----------------------------------------------------------------------------------------------
# Train an encoder
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def training_page():
    import test_page_training as training_page
    at = training_page.page()
    yield at, training_page
    for key in ("training.trainer", "training.ablation_trainer"):
        if key in at.session_state:
            at.session_state[key].reset()


def test_training_charts_are_the_runs_curves_and_the_trained_models_attention(training_page):
    """A short run on the readable step, then validation example 3: the loss curve is every step's
    batch loss, the accuracy curves the batch and validation accuracies where measured, and the grid
    each layer's and head's attention of the trained model on that example (fails on a grid drawn
    from the initial weights, from example 0, or with layers and heads out of order)."""
    from core import tasks
    from core.model import transformer

    at, training_page = training_page
    at.run()
    for key, value in (("steps", 30), ("d_model", 16), ("heads", 2)):
        at.number_input(key=f"training.{key}").set_value(value)
    at.selectbox(key="training.task").set_value("increasing")
    at.radio(key="training.positional").set_value("learned")
    at.radio(key="training.track").set_value("readable")
    at.run()
    training_page.button(at, "Start training").click().run()
    assert training_page.rerun_until(at, lambda a: training_page.trainer_of(a).status == "done", timeout=120)
    at.number_input(key="training.example").set_value(3).run()
    check(at)
    trainer = training_page.trainer_of(at)
    run = trainer.view().runs[0]
    assert run.step == 30
    curves = line_charts(at)
    loss = curves["Loss (cross-entropy of each batch)"]
    assert list(loss["step"]) == [m["step"] for m in run.metrics] == list(range(1, 31))
    np.testing.assert_allclose(loss["loss"], [m["loss"] for m in run.metrics], **CLOSE)
    accuracy = curves["Accuracy"]
    batch = accuracy[accuracy["curve"] == "training batch"]
    np.testing.assert_allclose(batch["accuracy"], [m["train_acc"] for m in run.metrics], **CLOSE)
    val = accuracy[accuracy["curve"] == "validation"]
    evaluated = [m for m in run.metrics if m["evaluated"]]
    assert list(val["step"]) == [m["step"] for m in evaluated] and len(evaluated) >= 2
    np.testing.assert_allclose(val["accuracy"], [m["val_acc"] for m in evaluated], **CLOSE)
    params, cfg = trainer.params()
    X_val = tasks.make_dataset("increasing", *training_page.SIZES, seed=0).X_val
    _, cache = transformer.forward(params, cfg, X_val[3][None])
    (grid,) = heatmap_grids(at)
    want = {f"layer {l + 1}, head {h + 1}": cache[f"blocks.{l}.attn.weights"][0, h]
            for l in range(cfg.n_layers) for h in range(cfg.n_heads)}
    assert_same_panels_f32(grid, want)
    _, other = transformer.forward(params, cfg, X_val[0][None])
    assert np.abs(other["blocks.1.attn.weights"] - cache["blocks.1.attn.weights"]).max() > 1e-3


def test_training_ablation_charts_are_each_runs_validation_accuracy(training_page):
    """The two ablation charts: the reference run against the run without positions, then against
    the one-head run, each curve that run's validation accuracy at the steps it was measured."""
    at, training_page = training_page
    at.run()
    at.number_input(key="training.ablation_steps").set_value(30).run()
    training_page.button(at, "Run the ablations").click().run()
    ablation = at.session_state["training.ablation_trainer"]
    assert training_page.rerun_until(at, lambda a: ablation.status == "done", timeout=300)
    at.run()
    check(at)
    pe, no_pe, one_head = ablation.view().runs
    shown = [chart.data for chart in charts(at) if chart.kind == "lines" and chart.title == "Validation accuracy"]
    assert len(shown) == 2
    for frame, runs in zip(shown, ((pe, no_pe), (pe, one_head))):
        assert list(dict.fromkeys(frame["curve"])) == [r.label for r in runs]
        for r in runs:
            evaluated = [m for m in r.metrics if m["evaluated"]]
            curve = frame[frame["curve"] == r.label]
            assert list(curve["step"]) == [m["step"] for m in evaluated] and len(evaluated) >= 2
            np.testing.assert_allclose(curve["accuracy"], [m["val_acc"] for m in evaluated], **CLOSE)


# ----------------------------------------------------------------------------------------------
# Make it fast
# ----------------------------------------------------------------------------------------------
def test_make_it_fast_charts_are_the_measured_table():
    """The two curves plot the table's measured rows: each kernel's time per call at each T, and its
    GFLOP/s, which must be H (2 T² d_k + 2 T² d_v) over that time (fails on a curve drawn from another
    column, a kernel's points under another kernel, or a rate computed with another size)."""
    at = open_page(view("make_it_fast"), {"T": "6, 16", "H": "2", "dk": "8"})
    check(at)
    (table,) = [d.value for d in at.dataframe if len(d.value.columns) and d.value.columns[0] == "T"]
    # the table writes its times to 0.1 µs and its rates to 0.01 GFLOP/s (a row not run says so instead)
    numbers = table.assign(**{c: pd.to_numeric(table[c], errors="coerce") for c in ("time (µs)", "GFLOP/s")})
    measured = numbers.dropna(subset=["time (µs)"]).reset_index(drop=True)
    assert len(measured) == 6
    curves = line_charts(at)
    times, rates = curves["time per call"], named(curves, "achieved GFLOP/s")
    for curve in (times, rates):
        assert list(zip(curve["T"], curve["kernel"])) == list(zip(measured["T"], measured["kernel"]))
    np.testing.assert_allclose(times["time (µs)"], measured["time (µs)"], rtol=0, atol=0.05 + 1e-9)
    np.testing.assert_allclose(rates["GFLOP/s"], measured["GFLOP/s"], rtol=0, atol=0.005 + 1e-9)
    flops = 2 * (2 * rates["T"] ** 2 * 8 + 2 * rates["T"] ** 2 * 8)
    np.testing.assert_allclose(rates["GFLOP/s"], flops / (times["time (µs)"] * 1e-6) / 1e9, rtol=1e-9)


def test_decoder_run_curves_are_its_metrics_and_the_maps_its_trained_weights():
    """After a short run: the loss curve is every step's batch loss, the validation curve the metric
    at each step it was measured (the start and the end), and the teacher-forced grid is drawn with
    the trained weights, not the initial ones."""
    import test_page_decoder as decoder_page
    from core.model import decoder
    from core.training.decoder_runs import build

    at = decoder_page.page()
    try:
        at.run()
        at.number_input(key="decoder.steps").set_value(12)
        at.radio(key="decoder.track").set_value("readable")
        at.run()
        decoder_page.button(at, "Train").click().run()
        trainer = at.session_state[decoder_page.TRAINER]
        assert trainer.join(120)
        at.run()
        check(at)
        view = trainer.view()
        assert view.status == "done" and len(view.metrics) == 12
        curves = line_charts(at)
        loss = curves["Loss (cross-entropy of each batch)"]
        assert list(loss["step"]) == list(range(1, 13))
        np.testing.assert_allclose(loss["loss"], [m["loss"] for m in view.metrics], **CLOSE)
        evals = curves[f"Validation {view.metric}"]
        assert list(evals["step"]) == [0, 12]
        np.testing.assert_allclose(evals["value"], [e["value"] for e in view.evals], **CLOSE)
        setup = build("reverse")
        trained = {k: np.asarray(v, np.float64) for k, v in trainer.model(setup)[0].items()}
        initial = {k: np.asarray(v, np.float64) for k, v in decoder.init_params(setup.cfg, seed=0).items()}
        tgt_in, _, src = (a[0] for a in setup.val_arrays())
        (grid,) = heatmap_grids(at)
        _, forced = decoder.forward(trained, setup.cfg, tgt_in, src)
        _, before = decoder.forward(initial, setup.cfg, tgt_in, src)
        assert_same_panels(grid, {f"layer {l + 1}, head {h + 1}": forced[f"dec.blocks.{l}.cross.weights"][0, h]
                                  for l in range(2) for h in range(setup.cfg.decoder.n_heads)})
        assert np.abs(forced["dec.blocks.1.cross.weights"] - before["dec.blocks.1.cross.weights"]).max() > 1e-4
    finally:
        if decoder_page.TRAINER in at.session_state:
            at.session_state[decoder_page.TRAINER].reset()
