"""The older models are settings of the one transformer: their parameters renamed by the one table
(core.model.vocabulary) run the same forward pass, and the readable step (transformer_backward)
gives the compiled step's loss and gradients: the encoder classifier's (``encoder.loss_and_grads``,
mean over the batch) and the decoder's (``decoder_step.Gradient``, mean over every target token),
decoder-only, attention-only and encoder-decoder."""
import numpy as np
import pytest

from core.model import decoder, decoder_step, encoder
from core.model import params as P
from core.model import transformer as tr
from core.model import config as C
from core.model import transformer_encdec as ed
from core.model import vocabulary as vocab

ENCODERS = {
    "sinusoidal": encoder.EncoderConfig(vocab_size=9, seq_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=2, n_classes=3),
    "learned": encoder.EncoderConfig(vocab_size=9, seq_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=1,
                                     positional="learned"),
    "none": encoder.EncoderConfig(vocab_size=9, seq_len=8, d_model=12, n_heads=3, d_ff=8, n_layers=2,
                                  positional="none"),
}
DECODERS = {
    "decoder-only": decoder.DecoderConfig(vocab_size=9, tgt_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                                          cross_attention=False),
    "attention-only": decoder.DecoderConfig(vocab_size=9, tgt_len=8, d_model=8, n_heads=2, d_ff=0, n_layers=2,
                                            cross_attention=False),
    "learned": decoder.DecoderConfig(vocab_size=9, tgt_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=1,
                                     cross_attention=False, positional="learned"),
    "attention-only-none": decoder.DecoderConfig(vocab_size=9, tgt_len=8, d_model=8, n_heads=4, d_ff=0, n_layers=3,
                                                 cross_attention=False, positional="none"),
    "encoder-decoder": decoder.DecoderConfig(vocab_size=9, tgt_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                                             src_vocab_size=7, src_len=6),
    "encoder-decoder-attention-only-learned": decoder.DecoderConfig(
        vocab_size=9, tgt_len=8, d_model=8, n_heads=2, d_ff=0, n_layers=2, src_vocab_size=7, src_len=6,
        positional="learned"),
}
TOL = {np.float64: 1e-12, np.float32: 2e-5}


def randomised(params: dict, dtype, seed: int) -> dict:
    """Every parameter moved off its initial value (biases non-zero, LayerNorm gains away from 1)."""
    rng = np.random.default_rng(seed)
    return {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype) for n, v in params.items()}


def assert_same(ours: dict, ref: dict, dtype):
    """Each array to ``TOL`` relative, measured against the largest entry of them all."""
    assert list(ours) == list(ref)
    tol = TOL[dtype]
    scale = max(np.abs(v).max() for v in ref.values())
    for name in ref:
        assert ours[name].dtype == ref[name].dtype == dtype, name
        np.testing.assert_allclose(ours[name], ref[name], rtol=tol, atol=tol * scale, err_msg=name)


def encoder_case(name, dtype, seed=0):
    cfg = ENCODERS[name]
    params = randomised(encoder.init_params(cfg, seed, np.float64), dtype, seed)
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(0, cfg.vocab_size, (5, cfg.seq_len - 1))
    labels = rng.integers(0, cfg.n_classes, 5)
    return cfg, params, tokens, labels


def decoder_case(name, dtype, seed=0):
    cfg = DECODERS[name]
    params = randomised(decoder.init_params(cfg, seed, np.float64), dtype, seed)
    rng = np.random.default_rng(seed + 1)
    tgt_in, tgt_out = (rng.integers(0, cfg.vocab_size, (4, cfg.tgt_len - 1)) for _ in range(2))
    src = rng.integers(0, cfg.src_vocab_size, (4, cfg.src_len - 1)) if cfg.cross_attention else None
    return cfg, params, tgt_in, tgt_out, src


def readable_forward(params, cfg, tgt_in, src=None):
    """The one transformer (or its encoder-decoder) on a decoder's parameters."""
    tparams, tcfg = vocab.from_decoder(params, cfg)
    return ed.forward(tparams, tcfg, src, tgt_in) if cfg.cross_attention else tr.forward(tparams, tcfg, tgt_in)


# ----------------------------------------------------------------------------------------------
# the forward pass
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_forward_is_the_transformer_with_a_classifier(name):
    cfg, params, tokens, _ = encoder_case(name, np.float64)
    logits, cache = encoder.forward(params, tokens, cfg)
    tparams, tcfg = vocab.from_encoder(params, cfg)
    ours, tcache = tr.forward(tparams, tcfg, tokens)
    np.testing.assert_allclose(ours, logits, rtol=1e-12, atol=1e-12 * np.abs(logits).max())
    weights = np.stack([tcache[f"blocks.{i}.attn.weights"] for i in range(cfg.n_layers)])
    np.testing.assert_allclose(weights, cache["attn"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tcache["pooled"], cache["pooled"], rtol=1e-12, atol=1e-12)
    # the compiled forward's cache answers to the same names as the readable one's
    for name in [f"blocks.{i}.attn.weights" for i in range(cfg.n_layers)] + [
            f"blocks.{cfg.n_layers - 1}.resid_post", "pooled", "logits"]:
        np.testing.assert_allclose(cache[name], tcache[name], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_forward_gives_the_compiled_steps_loss(name):
    """decoder.forward is the one transformer under the decoder's settings: its logits give, to
    rounding, the mean cross-entropy the compiled step computes on its own, and its cache uses the
    one vocabulary (the attention weights of every block, causal, rows summing to 1)."""
    cfg, params, tgt_in, tgt_out, src = decoder_case(name, np.float64, seed=3)
    logits, cache = decoder.forward(params, cfg, tgt_in, src)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, tgt_out[..., None], axis=-1).mean()
    flat, _ = P.pack(params)
    compiled = decoder_step.Gradient(cfg, flat)(tgt_in, tgt_out, src, np.empty_like(flat))
    assert loss == pytest.approx(compiled, rel=1e-12)
    ours, _ = readable_forward(params, cfg, tgt_in, src)
    np.testing.assert_array_equal(ours, logits)
    weights = decoder.attention_weights(cache, cfg)
    T = tgt_in.shape[1]
    assert weights.shape == (cfg.n_layers, len(tgt_in), cfg.n_heads, T, T)
    assert (weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# the readable step against the compiled one
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ENCODERS)
def test_readable_step_gives_the_compiled_encoder_step(name, dtype):
    """Both are the mean cross-entropy over the batch's sequences, and its gradient."""
    cfg, params, tokens, labels = encoder_case(name, dtype, seed=2)
    loss, grads = encoder.loss_and_grads(params, tokens, labels, cfg)            # compiled
    t_loss, t_grads = vocab.encoder_loss_and_grads(params, tokens, labels, cfg)  # readable
    assert t_loss == pytest.approx(loss, rel=TOL[dtype])
    assert_same(t_grads, grads, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", DECODERS)
def test_readable_step_gives_the_compiled_decoder_step(name, dtype):
    """Both are the mean cross-entropy over every target token of the batch, and its gradient."""
    cfg, params, tgt_in, tgt_out, src = decoder_case(name, dtype, seed=3)
    flat, _ = P.pack(params)
    out = np.empty_like(flat)
    loss = decoder_step.Gradient(cfg, flat)(tgt_in, tgt_out, src, out)         # compiled
    grads = {n: g.copy() for n, g in vocab.unflatten(out, decoder.param_shapes(cfg)).items()}
    t_loss, t_grads = vocab.decoder_loss_and_grads(params, cfg, tgt_in, tgt_out, src)   # readable
    assert t_loss == pytest.approx(loss, rel=TOL[dtype])
    assert_same(t_grads, grads, dtype)


# ----------------------------------------------------------------------------------------------
# the table itself
# ----------------------------------------------------------------------------------------------
def test_the_table_names_every_parameter_once_and_round_trips():
    cfg = ENCODERS["learned"]
    table = vocab.encoder_names(cfg)
    assert table["layers.0.ln1_g"] == "blocks.0.ln1.g" and table["W_cls"] == "classifier.W"
    assert table["layers.0.W_1"] == "blocks.0.ffn.W_1" and table["pos"] == "pos"
    dcfg = DECODERS["decoder-only"]
    dtable = vocab.decoder_names(dcfg)
    assert dtable["dec.layers.1.W_1"] == "blocks.1.ffn.W_1" and dtable["W_out"] == "unembed"
    assert dtable["b_out"] == "unembed_b" and dtable["dec.embed"] == "embed"
    assert not any("ffn" in n or "ln2" in n for n in vocab.decoder_names(DECODERS["attention-only"]).values())
    etable = vocab.decoder_names(DECODERS["encoder-decoder"])
    assert etable["enc.layers.1.ln2_g"] == "enc.blocks.1.ln2.g" and etable["enc.embed"] == "enc.embed"
    assert etable["dec.layers.0.cross_W_Q"] == "dec.blocks.0.cross.W_Q" and etable["W_out"] == "unembed"
    assert etable["dec.layers.0.ln_cross_b"] == "dec.blocks.0.ln_cross.b"
    assert sorted(etable.values()) == sorted(ed.param_shapes(vocab.decoder_settings(DECODERS["encoder-decoder"])))
    for names, tcfg in ((table, vocab.encoder_settings(cfg)), (dtable, vocab.decoder_settings(dcfg))):
        assert len(set(names.values())) == len(names)
        assert sorted(names.values()) == sorted(C.param_shapes(tcfg))
    params = encoder.init_params(cfg, 1, np.float64)
    back = vocab.to_encoder_names(vocab.from_encoder(params, cfg)[0], cfg)
    assert list(back) == list(params) and all(back[n] is params[n] for n in params)


def test_wrong_parameters_are_refused():
    cfg = ENCODERS["sinusoidal"]
    params = encoder.init_params(cfg)
    with pytest.raises(ValueError, match="missing"):
        vocab.from_encoder({k: v for k, v in params.items() if k != "W_cls"}, cfg)
    with pytest.raises(ValueError, match="unexpected"):
        vocab.from_encoder({**params, "extra": np.zeros(2)}, cfg)
    dcfg = DECODERS["encoder-decoder"]
    dparams = decoder.init_params(dcfg)
    with pytest.raises(ValueError, match="missing"):
        vocab.from_decoder({k: v for k, v in dparams.items() if k != "dec.layers.1.cross_b_O"}, dcfg)
    tokens = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="source"):
        vocab.decoder_loss_and_grads(dparams, dcfg, tokens, tokens)
    with pytest.raises(ValueError, match="no source"):
        only = DECODERS["decoder-only"]
        vocab.decoder_loss_and_grads(decoder.init_params(only), only, tokens, tokens, tokens)
    with pytest.raises(ValueError):
        vocab.encoder_loss_and_grads(params, [[1, 2, 99]], [0], cfg)
