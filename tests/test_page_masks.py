"""The Masks and cross-attention page: causal, padding and rectangular cross-attention on screen."""
from pathlib import Path

import numpy as np

from core import attention, masks

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "masks.py")


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
    assert "largest weight on a padded key is **0.0**" in text
    assert "weights of shape **4 × 3** per head" in text                 # Tq = 4 target, Tk = 3 source words
    mask_table = at.dataframe[0].value
    assert mask_table.shape == (8, 8) and mask_table.iloc[0, 1] == "−∞" and mask_table.iloc[1, 0] == "0"
    assert at.dataframe[1].value["example"].tolist() == ["BERT", "GPT", "original Transformer, T5"]


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
    assert "largest weight on a padded key is **0.0**" in _text(at)
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
    at.slider(key="masks.T").set_value(7).run()
    assert at.query_params["T"] == "7" and at.query_params["sentence"] == "a b c"
    at.slider(key="masks.T").set_value(6).run()                       # back to the default: left out
    assert "T" not in at.query_params


def test_a_bad_link_is_a_warning_and_the_defaults():
    at = open_page(PAGE, {"heads": "3", "T": "999"})
    assert not at.exception and at.warning
    assert at.select_slider(key="masks.heads").value == "2" and at.slider(key="masks.T").value == 6
