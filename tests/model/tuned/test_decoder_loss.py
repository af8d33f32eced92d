"""Readable equals compiled, for each decoder kind (encoder-decoder, decoder-only, attention-only):
the compiled gradient training runs (core.model.tuned.decoder_loss) against the readable one
(decoder.loss_and_grads, itself checked against finite differences and PyTorch), both through the
two training tracks (core.training.steps.decoder_gradient)."""
import numpy as np
import pytest

from core.model import decoder, presets
from core.model.tuned.decoder_loss import Gradient
from core.model.params import pack
from core.model.transformer_encdec import EncoderDecoderConfig, target_stack
from core.training import steps

BASE = dict(vocab_size=11, n_ctx=7, d_model=16, n_heads=2, n_layers=2)
SOURCE = dict(src_vocab_size=9, src_len=8)
CONFIGS = {
    "encoder-decoder": presets.seq2seq(**BASE, **SOURCE, d_ff=24),
    "encoder-decoder, learned positions, 4 heads, one layer": presets.seq2seq(
        **dict(BASE, n_heads=4, n_layers=1), **SOURCE, d_ff=24, positional="learned"),
    "encoder-decoder, no positions, attention-only": presets.seq2seq(**BASE, **SOURCE, d_ff=0, positional="none"),
    "decoder-only": presets.decoder_lm(**BASE, d_ff=24),
    "decoder-only, no positions, 3 layers": presets.decoder_lm(**dict(BASE, n_layers=3), d_ff=24, positional="none"),
    "attention-only, learned positions": presets.attention_only(**BASE, positional="learned"),
    "attention-only": presets.attention_only(**BASE),
}
TOLERANCE = {np.float64: 1e-12, np.float32: 2e-5}


def _case(cfg, dtype, B, T, S, seed=0):
    """Parameters with non-trivial biases and gains, packed as training packs them, and a batch."""
    params = decoder.init_params(cfg, seed, dtype)
    rng = np.random.default_rng(seed + 1)
    for value in params.values():
        if value.ndim == 1:
            value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
    flat, views = pack({name: params[name] for name in decoder.param_shapes(cfg)})
    vocab = target_stack(cfg).vocab_size
    src = rng.integers(0, cfg.encoder.vocab_size, (B, S)) if isinstance(cfg, EncoderDecoderConfig) else None
    return flat, views, rng.integers(0, vocab, (B, T)), rng.integers(0, vocab, (B, T)), src


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", CONFIGS)
# B = 19: two chunks, the second padded; T < S and T > S: cross-attention with unequal lengths
@pytest.mark.parametrize("B, T, S", [(19, 6, 8), (5, 7, 3)], ids=["B19-T6-S8", "B5-T7-S3"])
def test_compiled_gradient_equals_the_readable_one(kind, dtype, B, T, S):
    cfg = CONFIGS[kind]
    flat, views, tgt_in, tgt_out, src = _case(cfg, dtype, B, T, S)
    want_loss, want = decoder.loss_and_grads(views, cfg, tgt_in, tgt_out, src)
    tol = TOLERANCE[dtype]
    for track in steps.TRACKS:
        grads = np.full_like(flat, np.nan)                     # every entry must be written
        loss = steps.decoder_gradient(track, cfg, flat)(tgt_in, tgt_out, src, grads)
        assert loss == pytest.approx(want_loss, rel=tol), track
        at = 0
        for name, value in want.items():
            got = grads[at:at + value.size].reshape(value.shape)
            at += value.size
            scale = max(np.abs(value).max(), 1e-3)
            np.testing.assert_allclose(got / scale, value / scale, rtol=0, atol=tol, err_msg=f"{track} {name}")
        assert at == flat.size


def test_the_compiled_step_reads_the_one_vocabularys_names():
    """A parameter moved under its name moves the compiled loss as it moves the readable one."""
    cfg = CONFIGS["encoder-decoder"]
    flat, views, tgt_in, tgt_out, src = _case(cfg, np.float64, 3, 5, 4)
    for name in ("dec.blocks.1.cross.b_V", "dec.blocks.0.ln_cross.g", "enc.blocks.1.ffn.b_2", "unembed_b"):
        views[name] += 0.5
        want, _ = decoder.loss_and_grads(views, cfg, tgt_in, tgt_out, src)
        got = Gradient(cfg, flat)(tgt_in, tgt_out, src, np.empty_like(flat))
        assert got == pytest.approx(want, rel=1e-12), name


def test_a_buffer_of_another_model_is_refused():
    with pytest.raises(ValueError, match="the model has"):
        Gradient(CONFIGS["encoder-decoder"], np.zeros(10, np.float32))
