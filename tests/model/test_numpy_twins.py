"""The readable sublayers' NumPy formulas, which run while a freshly started server still compiles
their loops (core.model.layers.compiled_or), against the compiled loops: forward, backward and
every gradient, in float32 and float64, with and without a causal mask, and a row with nothing
allowed (all zeros, never NaN)."""
import numpy as np
import pytest

from core.model import layers as L
from core.model import multi_head as MH
from core.model import config as C
from core.model import transformer_backward as TB

TOL = {np.float64: 1e-12, np.float32: 2e-5}
CONFIGS = {
    "encoder classifier": dict(vocab_size=7, n_ctx=6, d_model=12, n_heads=3, d_ff=10, n_layers=2, causal=False,
                               head="classify", n_classes=3),
    "GPT-style decoder": dict(vocab_size=9, n_ctx=6, d_model=8, n_heads=2, d_ff=16, n_layers=2, norm_placement="pre",
                              activation="gelu_tanh", final_ln=True),
    "Llama-style decoder": dict(vocab_size=9, n_ctx=6, d_model=8, n_heads=2, d_ff=16, n_layers=2, norm_placement="pre",
                                norm="rmsnorm", activation="silu", gated_ffn=True, final_ln=True, bias=False),
}


def _both(fn, monkeypatch):
    """``fn()`` with the compiled loops, then with every loop's NumPy formula."""
    compiled = fn()
    with monkeypatch.context() as m:
        m.setattr(L, "can_run", lambda *args: False)
        twin = fn()
    return compiled, twin


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_numpy_formulas_give_the_compiled_loss_logits_and_gradients(name, dtype, monkeypatch):
    cfg = C.TransformerConfig(**CONFIGS[name])
    params = C.init_params(cfg, 3, dtype)
    rng = np.random.default_rng(0)
    for value in params.values():
        value[...] = rng.normal(0, 0.3, value.shape)
    tokens = rng.integers(0, cfg.vocab_size, (4, 6))
    targets = rng.integers(0, cfg.n_classes, 4) if cfg.head == "classify" else rng.integers(0, cfg.vocab_size, (4, 6))
    (loss_c, logits_c, grads_c), (loss_n, logits_n, grads_n) = _both(
        lambda: TB.forward_backward(params, cfg, tokens, targets), monkeypatch)
    tol = TOL[dtype]
    np.testing.assert_allclose(loss_n, loss_c, rtol=tol)
    np.testing.assert_allclose(logits_n, logits_c, rtol=tol, atol=tol)
    assert grads_n.keys() == grads_c.keys()
    for key in grads_c:
        np.testing.assert_allclose(grads_n[key], grads_c[key], rtol=tol * 10, atol=tol * 10, err_msg=key)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_the_attention_rows_backward_in_both(dtype, causal, monkeypatch):
    rng = np.random.default_rng(1)
    cfg = C.TransformerConfig(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, d_ff=0, n_layers=1)
    x, memory = rng.normal(size=(2, 4, 8)).astype(dtype), rng.normal(size=(2, 3, 8)).astype(dtype)
    w = {k: rng.normal(0, 0.3, (8, 8) if k.startswith("W") else (8,)).astype(dtype) for k in MH.ATTENTION_PARAMS}
    cache = {}
    kv = x if causal else memory                               # masked self-attention, or cross-attention
    out = MH.attend(x, kv, w, cfg, cache, "a", causal=causal)
    if causal:
        assert (cache["a.weights"][:, :, 0, 1:] == 0).all()              # a later key gets exactly 0
    np.testing.assert_allclose(cache["a.weights"].sum(-1), 1.0, rtol=TOL[dtype])
    d_out = rng.normal(size=out.shape).astype(dtype)
    compiled, twin = _both(lambda: MH.attend_backward(d_out, w, cfg, cache, "a"), monkeypatch)
    for c, n in zip(compiled[:2], twin[:2]):
        np.testing.assert_allclose(n, c, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    for name in w:
        np.testing.assert_allclose(twin[2][name], compiled[2][name], rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_and_its_gradient_and_the_products(dtype, monkeypatch):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(3, 50)) * 4).astype(dtype)
    for fn in (L.gelu_erf, lambda v: L.gelu_tanh_backward(np.ones_like(v), v),
               lambda v: L.gelu_erf_backward(np.ones_like(v), v),
               lambda v: L.matmul(v, v.T.copy()), lambda v: L.matmul(v[None].repeat(2, 0), v.T.copy())):
        compiled, twin = _both(lambda: fn(x), monkeypatch)
        np.testing.assert_allclose(twin, compiled, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("T, d", [(7, 6), (5, 5), (1, 1)])
def test_the_sinusoid_table(T, d):
    from core.kernels import cpu

    compiled, twin = np.empty((T, d)), np.empty((T, d))
    cpu.sinusoidal_kernel(10000.0, compiled)
    L._sinusoid_numpy(10000.0, twin)
    np.testing.assert_allclose(twin, compiled, rtol=1e-13, atol=1e-15)
