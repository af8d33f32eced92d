"""The compiled decoder gradient that training runs (core.model.decoder_step) against the readable
one (decoder.loss_and_grads, itself checked against finite differences and PyTorch)."""
import numpy as np
import pytest

from core.model import decoder as D
from core.model.decoder import DecoderConfig
from core.model.decoder_step import Gradient

BASE = dict(vocab_size=11, tgt_len=7, d_model=16, n_heads=2, d_ff=24, n_layers=2)
ENC_DEC = dict(BASE, cross_attention=True, src_vocab_size=9, src_len=8)
CONFIGS = {
    "encoder-decoder": ENC_DEC,
    "encoder-decoder, learned positions, 4 heads, one layer": dict(ENC_DEC, positional="learned", n_heads=4, n_layers=1),
    "encoder-decoder, no positions, attention-only": dict(ENC_DEC, positional="none", d_ff=0),
    "decoder-only": dict(BASE, cross_attention=False),
    "decoder-only, learned positions, attention-only": dict(BASE, cross_attention=False, positional="learned", d_ff=0),
}
TOLERANCE = {np.float64: 1e-12, np.float32: 2e-5}


def _case(cfg, dtype, B, T, S, seed=0):
    """Parameters with non-trivial biases and gains, packed as training packs them, and a batch."""
    params = D.init_params(cfg, seed, dtype)
    rng = np.random.default_rng(seed + 1)
    for value in params.values():
        if value.ndim == 1:
            value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
    names = list(D.param_shapes(cfg))
    flat, views = D.pack({name: params[name] for name in names})
    src = rng.integers(0, cfg.src_vocab_size, (B, S)) if cfg.cross_attention else None
    return names, flat, views, rng.integers(0, cfg.vocab_size, (B, T)), rng.integers(0, cfg.vocab_size, (B, T)), src


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", CONFIGS)
# B = 19: two chunks, the second padded; T < S and T > S: cross-attention with unequal lengths
@pytest.mark.parametrize("B, T, S", [(19, 6, 8), (5, 7, 3)], ids=["B19-T6-S8", "B5-T7-S3"])
def test_compiled_gradient_equals_the_readable_one(kind, dtype, B, T, S):
    cfg = DecoderConfig(**CONFIGS[kind])
    names, flat, views, tgt_in, tgt_out, src = _case(cfg, dtype, B, T, S)
    grads = np.full_like(flat, np.nan)                         # every entry must be written
    loss = Gradient(cfg, flat)(tgt_in, tgt_out, src, grads)
    want_loss, want = D.loss_and_grads(views, cfg, tgt_in, tgt_out, src)
    tol = TOLERANCE[dtype]
    assert loss == pytest.approx(want_loss, rel=tol)
    for name in names:
        got = grads[Gradient(cfg, flat).offsets[name]:][:want[name].size].reshape(want[name].shape)
        scale = max(np.abs(want[name]).max(), 1e-3)
        np.testing.assert_allclose(got / scale, want[name] / scale, rtol=0, atol=tol, err_msg=name)


def test_a_buffer_of_another_model_is_refused():
    cfg = DecoderConfig(**ENC_DEC)
    with pytest.raises(ValueError, match="the model has"):
        Gradient(cfg, np.zeros(10, np.float32))
