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
