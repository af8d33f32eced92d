"""The Masks and cross-attention page: causal, padding and rectangular cross-attention on screen."""
import re
from pathlib import Path

import numpy as np

import pytest

from core import attention, masks
from core.lessons import questions

from page_support import answer_question, heatmap_grids, open_page, table_named

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "masks.py")


def _text(at):
    return " ".join(m.value for m in at.markdown)


def open_masked(link=None):
    """The page, its opening question answered and the causal mask turned on."""
    at = open_page(PAGE, link)
    at.toggle(key="masks.mask").set_value(True)
    return at.run()


def test_page_runs_with_its_sections_and_measurements():
    at = open_masked()
    assert not at.exception and not at.error
    assert [h.value for h in at.header] == [
        "The causal mask", "Padding masks in a batch", "Cross-attention: the decoder reads the encoder",
        "Encoder-only, decoder-only, encoder-decoder"]
    text = _text(at)
    assert "the largest weight above the diagonal is **exactly 0**" in text
    # row sums said plainly, not as "between 1.000000000000000 and 1.000000000000000"
    assert re.search(r"every row sums to (exactly 1|1 \(to within \de-1[5-7]\))\.", text), text
    assert "row sums between" not in text
    assert "the largest weight on a padded key is **exactly 0**" in text
    assert "weights of shape **4 × 3** per head" in text                 # Tq = 4 target, Tk = 3 source words
    check_causal_table(at, "the tired cat sat on the warm mat".split())
    check_padding(at, [6, 3, 5], T=6, heads=2, causal=False)
    families = next(t.value for t in at.table if "example" in t.value.columns)   # st.table: long cells wrap
    assert families["example"].tolist() == ["BERT", "GPT", "original Transformer, T5"]


def check_causal_table(at, words):
    """The causal mask on screen: M_ij = 0 for j <= i, -inf above, one row and column per word."""
    table = next(d.value for d in at.dataframe if list(d.value.index)[:1] == [f"1 {words[0]}"])
    labels = [f"{i + 1} {w}" for i, w in enumerate(words)]
    assert list(table.index) == labels and list(table.columns) == labels
    i, j = np.indices((len(words), len(words)))
    np.testing.assert_array_equal(table.to_numpy(), np.where(j <= i, "0", "−∞"))


def check_padding(at, lengths, *, T, heads, causal):
    """The padded batch on screen: its shape, and the keys each query reads, which are the first
    min(length, T) keys (and under the causal mask only up to the query itself)."""
    assert f"Weights of shape **{len(lengths)} × {heads} × {T} × {T}**" in _text(at)
    reads = table_named(at, "keys read")
    assert list(reads.index) == [f"sequence {b + 1} (length {n})" for b, n in enumerate(lengths)]
    query = np.arange(1, T + 1)
    want = [np.minimum(n, query) if causal else np.full(T, n) for n in lengths]
    np.testing.assert_array_equal(reads.to_numpy(int), want)
    assert "the largest weight on a padded key is **exactly 0**" in _text(at)


@pytest.mark.parametrize("widget, key, value, settings", [
    ("text_input", "lengths", "4, 0, 6, 1", dict(lengths=[4, 0, 6, 1])),
    ("slider", "T", 8, dict(T=8)),
    ("select_slider", "heads", "4", dict(heads=4)),
    ("checkbox", "causal", True, dict(causal=True)),
])
def test_each_padding_control_moves_the_numbers(widget, key, value, settings):
    at = open_page(PAGE)
    getattr(at, widget)(key=f"masks.{key}").set_value(value).run()
    assert not at.exception and not at.error
    check_padding(at, **{**dict(lengths=[6, 3, 5], T=6, heads=2, causal=False), **settings})


def test_the_sentence_sets_the_causal_mask():
    at = open_masked()
    at.text_input(key="masks.sentence").set_value("to be or not").run()
    assert not at.exception and not at.error
    check_causal_table(at, "to be or not".split())


def test_cross_attention_is_rectangular_and_follows_the_inputs():
    at = open_page(PAGE)
    at.text_input(key="masks.source").set_value("a b c d e f g")
    at.text_input(key="masks.target").set_value("x y").run()
    assert not at.exception
    assert "weights of shape **2 × 7** per head" in _text(at)
    # the same operation, directly: X_kv sets the key axis
    rng = np.random.default_rng(0)
    W = [rng.normal(size=(8, 8)) for _ in range(4)]
    res = attention.multi_head_attention(rng.normal(size=(2, 8)), *W, 2, X_kv=rng.normal(size=(7, 8)), backend="cpu")
    assert res.weights.shape == (2, 2, 7) and res.output.shape == (2, 8)
    np.testing.assert_allclose(res.weights.sum(-1), 1.0, atol=1e-12)


def test_padding_with_a_causal_mask_an_empty_sequence_and_bad_lengths():
    at = open_page(PAGE)
    at.text_input(key="masks.lengths").set_value("6, 2, 0")
    at.checkbox(key="masks.causal").check().run()
    assert not at.exception and not at.error
    check_padding(at, [6, 2, 0], T=6, heads=2, causal=True)
    # what the page computes: padded keys get exactly 0, an empty sequence gets zero rows (not NaN)
    mask = masks.combine(masks.padding([6, 2, 0], 6), masks.causal(6))
    X = np.random.default_rng(2).normal(size=(3, 6, 8))
    W = [np.eye(8)] * 4
    A = attention.multi_head_attention(X, *W, 2, mask=mask, backend="cpu").weights   # (B, H, T, T)
    assert A[1, :, :, 2:].max() == 0.0 and np.all(A[2] == 0.0)
    assert np.all(np.triu(A[0, 0], 1) == 0.0)
    # bad lengths: a message, never a traceback
    for typed, message in (("6, 9", "between 0 and T = 6"), ("a, b", "whole numbers")):
        at.text_input(key="masks.lengths").set_value(typed).run()
        assert not at.exception and message in at.error[0].value


def test_a_link_restores_every_control_and_changes_are_written_back():
    at = open_page(PAGE, {"sentence": "a b c", "mask": "1", "lengths": "2, 4", "T": "4", "heads": "4", "causal": "1",
                          "source": "x y", "target": "p q r s t"})
    assert not at.exception and not at.error and not at.warning
    assert at.text_input(key="masks.sentence").value == "a b c"
    assert at.slider(key="masks.T").value == 4 and at.select_slider(key="masks.heads").value == "4"
    assert at.checkbox(key="masks.causal").value and at.toggle(key="masks.mask").value
    assert "weights of shape **5 × 2** per head" in _text(at)          # 5 target, 2 source words
    check_causal_table(at, ["a", "b", "c"])
    check_padding(at, [2, 4], T=4, heads=4, causal=True)
    at.slider(key="masks.T").set_value(7).run()
    assert at.query_params["T"] == "7" and at.query_params["sentence"] == "a b c"
    at.slider(key="masks.T").set_value(6).run()                       # back to the default: left out
    assert "T" not in at.query_params


def test_a_bad_link_is_a_warning_and_the_defaults():
    at = open_page(PAGE, {"heads": "3", "T": "999"})
    assert not at.exception and at.warning
    assert at.select_slider(key="masks.heads").value == "2" and at.slider(key="masks.T").value == 6


# --- predict, then see --------------------------------------------------------------------------

OPENING = questions.opening("masks")


def test_the_causal_mask_stays_locked_until_the_opening_question_is_answered():
    at = open_page(PAGE, answered=False)
    assert not at.exception and not at.error
    assert at.toggle(key="masks.mask").disabled and at.checkbox(key="masks.causal").disabled
    assert list(heatmap_grids(at)[0]) == ["no mask"]                    # the causal map is the answer
    assert "above the diagonal" not in _text(at)
    at = answer_question(at, OPENING, OPENING.options[OPENING.answer])
    assert not at.toggle(key="masks.mask").disabled and not at.checkbox(key="masks.causal").disabled
    at.toggle(key="masks.mask").set_value(True).run()
    assert list(heatmap_grids(at)[0]) == ["no mask", "causal mask"]


def test_a_linked_causal_mask_is_not_shown_before_the_answer():
    at = open_page(PAGE, {"mask": "1", "causal": "1"}, answered=False)
    assert not at.exception and at.toggle(key="masks.mask").value
    assert list(heatmap_grids(at)[0]) == ["no mask"]
    check_padding(at, [6, 3, 5], T=6, heads=2, causal=False)


def test_the_opening_answer_is_what_the_causal_map_shows():
    """Query 2's weight on key 5 and its row sum, read from the page's causal panel: exactly the
    right option's claims hold, and every other option's fail."""
    at = open_masked()
    free_grid = heatmap_grids(at)[0]
    A, F = free_grid["causal mask"], free_grid["no mask"]
    weight, total = A[1, 4], A[1].sum()
    claims = [weight == 0 and abs(total - 1) < 1e-12,                   # one claim per option, in order
              weight == 0 and total < 1 - 1e-12,
              0 < weight and abs(total - 1) < 1e-12,
              weight == F[1, 4]]
    assert len(claims) == len(OPENING.options)
    assert [i for i, holds in enumerate(claims) if holds] == [OPENING.answer]


def test_the_causal_sentences_follow_the_weights_on_screen():
    at = open_masked()
    A, F = heatmap_grids(at)[0]["causal mask"], heatmap_grids(at)[0]["no mask"]
    assert (np.triu(A, 1) == 0).all()
    text = _text(at)
    assert "its weight there is **1**, so its head output is its own value vector" in text
    assert (f"Query 2 puts {F[1, :2].sum():.2f} of its weight on keys 1 and 2 without the mask and "
            f"{A[1, :2].sum():.2f} with it") in text and F[1, :2].sum() < 0.995
    at.text_input(key="masks.sentence").set_value("a b").run()         # query 2 has no later key
    assert "Query 2 puts" not in _text(at)


def test_the_padding_mask_counts_positions_from_1():
    """A sequence of length n reads keys 1 … n: j ≤ ℓ_b on 1-based positions, as the table and the
    heatmaps number them (the 0-based j < ℓ_b read on those labels would hide key n)."""
    at = open_page(PAGE)
    latex = " ".join(x.value for x in at.latex)
    assert r"0 & j \le \ell_b" in latex and r"-\infty & j > \ell_b" in latex and r"j < \ell_b" not in latex
    reads = table_named(at, "keys read")
    assert list(reads.columns) == [f"query {i}" for i in range(1, 7)]
    grid = heatmap_grids(at)[1]
    for b, n in enumerate([6, 3, 5]):
        panel = grid[f"sequence {b + 1}: length {n}"]
        assert (panel[:, :n] > 0).all() and (panel[:, n:] == 0).all()   # keys 1 … n, counted from 1
        assert (reads.iloc[b] == n).all()


def test_an_empty_sequence_is_said_from_its_weights():
    at = open_page(PAGE)
    assert "A sequence of length 0 would get all-zero weights" in _text(at)
    at.text_input(key="masks.lengths").set_value("4, 0").run()
    assert "Sequence 2 has length 0: its weights are all 0, not NaN." in _text(at)
    assert (heatmap_grids(at)[1]["sequence 2: length 0"] == 0).all()
