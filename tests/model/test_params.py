"""Parameters of every model kind: fresh parameters pinned bit for bit, the flat buffer and its named
views, and the one check of a model's parameters."""
import hashlib

import numpy as np
import pytest

from core.model import config as C
from core.model import decoder, presets
from core.model import params as P


def digest(params: dict) -> str:
    """Names, shapes, dtypes and every bit of the values, in order."""
    h = hashlib.sha256()
    for name, value in params.items():
        h.update(f"{name}{value.shape}{value.dtype.str}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()[:16]


MODELS = {
    "encoder_classifier": presets.encoder_classifier(vocab_size=7, n_ctx=5, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                                                     n_classes=3, positional="learned"),
    "decoder_lm": presets.decoder_lm(11, 6, d_model=8, n_heads=2, d_ff=12, n_layers=2),
    "attention_only": presets.attention_only(9, 6, d_model=8, n_heads=2, n_layers=2),
    "gpt2": presets.gpt2(vocab_size=13, n_ctx=7, d_model=8, n_heads=2, n_layers=2),
    "bert": C.TransformerConfig(vocab_size=13, n_ctx=7, d_model=8, n_heads=2, d_ff=16, n_layers=2, activation="gelu_erf",
                                positional="learned", causal=False, head="none", n_token_types=2, embed_ln=True,
                                pooler=True),
    "seq2seq": presets.seq2seq(7, 5, 6, 4, d_model=8, n_heads=2, d_ff=12, n_layers=2, positional="learned"),
}
# Taken from init_params as it drew them when the shipped models were trained: any change to a draw,
# its order, its scale or its dtype changes a digest (and the shipped models would not retrain).
PINNED = {
    ("encoder_classifier", 0, "float32"): "11126ba011fadf52", ("encoder_classifier", 0, "float64"): "65f68f62088776e1",
    ("encoder_classifier", 3, "float32"): "1c7a124243c6afc5", ("encoder_classifier", 3, "float64"): "adf3f7fb4f8fb275",
    ("decoder_lm", 0, "float32"): "7c71cca2fe664875", ("decoder_lm", 0, "float64"): "5e26350c81069e8e",
    ("decoder_lm", 3, "float32"): "0dc0378ab23209b0", ("decoder_lm", 3, "float64"): "3086b7db868242e6",
    ("attention_only", 0, "float32"): "10d1280c3abbcb82", ("attention_only", 0, "float64"): "a0e2457229ffc162",
    ("attention_only", 3, "float32"): "8aa24e03c42d1ae4", ("attention_only", 3, "float64"): "b10220c8ba1eaaf2",
    ("gpt2", 0, "float32"): "603798d42611dffe", ("gpt2", 0, "float64"): "9c6fe7cd4f3df869",
    ("gpt2", 3, "float32"): "e1a60c8dfd967483", ("gpt2", 3, "float64"): "4eb3dd5c4ec087ae",
    ("bert", 0, "float32"): "8a5d962cb4e546b7", ("bert", 0, "float64"): "f4a8044de5f1c586",
    ("bert", 3, "float32"): "f2418f6a292a48da", ("bert", 3, "float64"): "5c2925b284b1ce93",
    ("seq2seq", 0, "float32"): "f74577da39fb1d5f", ("seq2seq", 0, "float64"): "a3073befa699b950",
    ("seq2seq", 3, "float32"): "96589dd2820042bb", ("seq2seq", 3, "float64"): "7805f71aff8d792a",
}


@pytest.mark.parametrize("model, seed, dtype", sorted(PINNED))
def test_fresh_parameters_are_the_pinned_ones_bit_for_bit(model, seed, dtype):
    params = decoder.init_params(MODELS[model], seed, np.dtype(dtype))    # a single stack: config.init_params
    assert digest(params) == PINNED[model, seed, dtype]


# --- the flat buffer and its named views --------------------------------------------------------

def test_named_views_cut_the_buffer_in_order_and_write_through():
    shapes = {"a": (2, 3), "b": (4,), "c": (), "d": (1, 2)}
    flat = np.arange(13.0)
    views = P.named_views(flat, shapes)
    assert list(views) == list(shapes) and {n: v.shape for n, v in views.items()} == shapes
    assert np.concatenate([v.ravel() for v in views.values()]).tolist() == flat.tolist()
    views["b"][...] = -1.0                                    # a view writes the buffer
    assert flat[6:10].tolist() == [-1.0] * 4 and flat[5] == 5.0 and flat[10] == 10.0


def test_pack_copies_the_parameters_into_one_buffer_their_views_read():
    cfg = MODELS["seq2seq"]
    params = decoder.init_params(cfg, 1, np.float64)
    flat, views = P.pack(params)
    assert flat.dtype == np.float64 and flat.size == decoder.param_count(cfg)
    assert all(np.array_equal(views[n], params[n]) for n in params)
    again = P.named_views(flat, decoder.param_shapes(cfg))
    assert all(np.shares_memory(again[n], views[n]) for n in params)
    flat *= 2.0                                               # one update of the buffer moves every view ...
    assert all(np.array_equal(views[n], 2.0 * params[n]) for n in params)
    assert digest(params) == digest(decoder.init_params(cfg, 1, np.float64))   # ... and no parameter it was copied from


def test_a_buffer_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="holds 5 numbers; these parameters need 6"):
        P.named_views(np.zeros(5), {"a": (2, 3)})
