"""The Masks and cross-attention page: causal, padding and rectangular cross-attention on screen."""
import re
from pathlib import Path

import numpy as np

import pytest

from core import attention, masks

from page_support import open_page, table_named

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "masks.py")


def _text(at):
    return " ".join(m.value for m in at.markdown)


def test_page_runs_with_its_sections_and_measurements():
    at = open_page(PAGE)
    assert not at.exception and not at.error
    assert [h.value for h in at.header] == [
        "The causal mask", "Padding masks in a batch", "Cross-attention: the decoder reads the encoder",
        "Encoder-only, decoder-only, encoder-decoder"]
    text = _text(at)
    assert "largest weight above the diagonal **0.0**" in text
    # row sums said plainly, not as "between 1.000000000000000 and 1.000000000000000"
    assert re.search(r"every row sums to (exactly 1|1 \(to within \de-1[5-7]\))\.", text), text
    assert "row sums between" not in text
    assert "largest weight on a padded key is **0.0**" in text
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
    assert "largest weight on a padded key is **0.0**" in _text(at)


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
    at = open_page(PAGE)
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
    at = open_page(PAGE, {"sentence": "a b c", "lengths": "2, 4", "T": "4", "heads": "4", "causal": "1",
                          "source": "x y", "target": "p q r s t"})
    assert not at.exception and not at.error and not at.warning
    assert at.text_input(key="masks.sentence").value == "a b c"
    assert at.slider(key="masks.T").value == 4 and at.select_slider(key="masks.heads").value == "4"
    assert at.checkbox(key="masks.causal").value
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
