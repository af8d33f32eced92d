"""Parameters of every model kind: fresh parameters pinned bit for bit, the flat buffer and its named
views, and the one check of a model's parameters (:func:`core.model.config.check_params`)."""
import hashlib

import numpy as np
import pytest

from core.model import config as C
from core.model import decoder, generation, presets, transformer
from core.model import params as P
from core.model import transformer_encdec as ED
from core.model.tuned import classifier


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


# --- the one check of a model's parameters ------------------------------------------------------

LM = MODELS["decoder_lm"]


def fresh(cfg=LM, dtype=np.float64):
    return decoder.init_params(cfg, 0, dtype)


def refusal(params, model=LM, **kw) -> str:
    with pytest.raises(ValueError) as err:
        C.check_params(params, model, **kw)
    return str(err.value)


def test_each_refusal_says_what_is_wrong_in_the_users_terms():
    p = fresh()
    assert refusal([]) == "params must be a dict of arrays, as init_params returns."
    missing = {k: v for k, v in p.items() if not k.startswith("blocks.1.")}
    assert refusal(missing) == ("params lacks 16 parameter(s) this configuration needs: missing blocks.1.attn.W_Q, "
                                "blocks.1.attn.W_K, blocks.1.attn.W_V, blocks.1.attn.W_O, blocks.1.attn.b_Q ....")
    assert refusal({**p, "extra": p["embed"]}) == "Unexpected parameters extra: this configuration does not use them."
    assert refusal({k: v.astype(np.float16) for k, v in p.items()}) == \
        "Parameters must be float32 or float64, got float16 for 'embed'."
    assert refusal({**p, "unembed": p["unembed"].T}) == \
        "Parameter 'unembed' has shape (11, 8); this configuration needs (8, 11)."
    assert refusal({**p, "unembed_b": p["unembed_b"].astype(np.float32)}) == \
        "Parameter 'unembed_b' is float32 but 'embed' is float64; use one dtype."
    assert refusal({**p, "unembed_b": p["unembed_b"].tolist()}) == "Parameter 'unembed_b' is not a NumPy array."


def test_nan_is_refused_only_where_asked():
    p = fresh()
    p["blocks.0.ffn.W_1"][2, 3] = np.nan
    assert C.check_params(p, LM) == np.float64                     # by default: names, shapes and dtype
    assert refusal(p, finite=True) == "Parameter 'blocks.0.ffn.W_1' contains NaN or infinity."


def test_a_config_and_its_shapes_are_checked_alike_and_two_stacks_by_their_shapes():
    p = fresh(dtype=np.float32)
    assert C.check_params(p, LM) == C.check_params(p, C.param_shapes(LM)) == np.float32
    bad = {**p, "pos": p["embed"]}
    assert refusal(bad) == refusal(bad, C.param_shapes(LM))
    cfg = MODELS["seq2seq"]
    pair = fresh(cfg)
    assert C.check_params(pair, ED.param_shapes(cfg)) == np.float64
    assert "missing dec.blocks.0.cross.W_Q" in refusal({k: v for k, v in pair.items() if ".cross." not in k},
                                                        ED.param_shapes(cfg))


def test_every_entry_point_refuses_with_the_same_words_and_the_trained_models_scan_for_nan():
    enc = MODELS["encoder_classifier"]
    tokens, labels = np.array([[1, 2, 3]]), np.array([1])
    missing = {k: v for k, v in fresh().items() if k != "unembed"}
    said = refusal(missing)
    calls = [lambda p: transformer.forward(p, LM, tokens), lambda p: decoder.forward(p, LM, tokens),
             lambda p: decoder.loss_and_grads(p, LM, tokens, tokens),
             lambda p: generation.generate(p, LM, prompt=[1], max_new_tokens=1)]
    for call in calls:
        with pytest.raises(ValueError) as err:
            call(missing)
        assert str(err.value) == said
    with pytest.raises(ValueError, match="lacks 1 parameter"):
        classifier.forward({k: v for k, v in fresh(enc).items() if k != "classifier.b"}, tokens, enc)
    nan = fresh()
    nan["embed"][0, 0] = np.inf
    with pytest.raises(ValueError, match="'embed' contains NaN or infinity"):
        decoder.loss_and_grads(nan, LM, tokens, tokens)             # a model we train: scanned
    nan_enc = fresh(enc)
    nan_enc["classifier.W"][0, 0] = np.nan
    with pytest.raises(ValueError, match="'classifier.W' contains NaN or infinity"):
        classifier.loss_and_grads(nan_enc, tokens, labels, enc)
    generation.generate(nan, LM, prompt=[2], max_new_tokens=1, temperature=0)   # not scanned: its logits are
