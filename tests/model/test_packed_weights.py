"""A loaded model's weights packed once for our own product (core.kernels.tuned.gemm): the forward
pass gives the numbers of the unpacked model, runs the packed product for every linear layer and the
tied unembedding, and a packed weight cannot be changed under its packed copy."""
import numpy as np
import pytest

from core.kernels.tuned import gemm
from core.model import config as C
from core.model import layers as L
from core.model import presets
from core.model import transformer as tr

# GPT-2's layout at a width whose d x d weights BLAS multiplies (384^2 >= BLAS_FROM), small otherwise
SETTINGS = dict(vocab_size=1000, n_ctx=64, d_model=384, n_heads=6, n_layers=2)
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


@pytest.fixture
def counted_products(monkeypatch):
    """The (K, N) of each packed weight a product ran on."""
    calls = []
    real = gemm.matmul_if_loaded

    def counting(x, W, *args, **kwargs):
        y = real(x, W, *args, **kwargs)
        if y is not None:
            calls.append(W.shape)
        return y

    monkeypatch.setattr(gemm, "matmul_if_loaded", counting)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_packed_model_gives_the_unpacked_models_numbers(dtype, counted_products):
    cfg = presets.gpt2(**SETTINGS)
    params = C.init_params(cfg, seed=3, dtype=dtype)
    rng = np.random.default_rng(1)
    for name, value in params.items():           # biases start at 0: give them values a product must add
        if name.rsplit(".", 1)[-1].startswith("b_"):
            params[name] = (0.1 * rng.normal(size=value.shape)).astype(dtype)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 9))
    want, want_cache = tr.forward(params, cfg, ids)
    assert counted_products == []

    L.pack_weights(params, transposed=("embed",))
    got, cache = tr.forward(params, cfg, ids)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert got.dtype == dtype and err < TOLERANCE[dtype], err
    for name in ("blocks.1.attn.weights", "blocks.1.resid_post"):
        np.testing.assert_allclose(cache[name], want_cache[name], rtol=0, atol=100 * TOLERANCE[dtype])
    d, V = cfg.d_model, cfg.vocab_size
    per_block = [(d, d)] * 4 + [(d, 4 * d), (4 * d, d)]            # W_Q, W_K, W_V, W_O, W_1, W_2
    assert sorted(counted_products) == sorted(per_block * cfg.n_layers + [(d, V)])


def test_a_packed_weight_is_read_only_and_only_weights_are_packed():
    cfg = presets.gpt2(**SETTINGS)
    params = C.init_params(cfg, seed=4, dtype=np.float32)
    L.pack_weights(params)
    W = params["blocks.0.attn.W_Q"]
    with pytest.raises(ValueError, match="read-only"):
        W[0, 0] = 1.0
    assert L.packed(W).shape == W.shape and L.packed(W, transposed=True) is None
    assert L.packed(params["embed"]) is None and L.packed(params["pos"]) is None
    small = presets.gpt2(**dict(SETTINGS, d_model=64, n_heads=2))            # a model the pages train
    tiny = C.init_params(small, seed=0, dtype=np.float32)
    L.pack_weights(tiny)
    assert all(L.packed(v) is None for v in tiny.values())


def test_a_model_whose_packed_copy_is_over_the_budget_is_not_packed(monkeypatch):
    """Packing keeps a second copy of the weights: over ATTENTION_PACKED_MB (or core.limits'
    MAX_PACKED_MB) nothing is packed, and the model runs its BLAS products, with the same numbers."""
    cfg = presets.gpt2(**SETTINGS)
    params = C.init_params(cfg, seed=5, dtype=np.float32)
    ids = np.arange(7)[None]
    want, _ = tr.forward(params, cfg, ids)
    monkeypatch.setenv("ATTENTION_PACKED_MB", "1")                 # the weights take 16 MB
    assert not L.pack_weights(params, transposed=("embed",))
    assert all(L.packed(v) is None and L.packed(v, transposed=True) is None for v in params.values())
    np.testing.assert_array_equal(tr.forward(params, cfg, ids)[0], want)
    monkeypatch.delenv("ATTENTION_PACKED_MB")
    monkeypatch.setattr(L.limits, "MAX_PACKED_MB", 1)
    assert not L.pack_weights(params)
    monkeypatch.setattr(L.limits, "MAX_PACKED_MB", 200)
    assert L.pack_weights(params) and L.packed(params["blocks.0.ffn.W_1"]) is not None


def test_while_the_packed_product_still_compiles_the_model_runs_its_blas_products(monkeypatch, counted_products):
    cfg = presets.gpt2(**SETTINGS)
    params = C.init_params(cfg, seed=6, dtype=np.float32)
    ids = np.arange(5)[None]
    want, _ = tr.forward(params, cfg, ids)
    L.pack_weights(params, transposed=("embed",))
    monkeypatch.setattr(gemm, "can_run", lambda kernel, *args: False)     # the warm-up has not loaded it
    got, _ = tr.forward(params, cfg, ids)
    assert counted_products == []
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
