"""A loaded model's weights packed once for our own product (core.kernels.tuned.gemm): the forward
pass gives the numbers of the unpacked model, runs the packed product for every linear layer and the
tied unembedding, and a packed weight cannot be changed under its packed copy."""
import dataclasses

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
    """The (K, N) of each packed weight a product ran on (a joined product's, each of its weights')."""
    calls = []
    real, real_joined = gemm.matmul_if_loaded, gemm.joined_matmul_if_loaded

    def counting(x, W, *args, **kwargs):
        y = real(x, W, *args, **kwargs)
        if y is not None:
            calls.append(W.shape)
        return y

    def counting_joined(x, Ws, *args, **kwargs):
        y = real_joined(x, Ws, *args, **kwargs)
        if y is not None:
            calls.extend(W.shape for W in Ws)
        return y

    monkeypatch.setattr(gemm, "matmul_if_loaded", counting)
    monkeypatch.setattr(gemm, "joined_matmul_if_loaded", counting_joined)
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation,placement", [("gelu_tanh", "pre"), ("gelu_erf", "post"), ("relu", "pre")])
def test_a_pass_keeping_nothing_joins_qkv_and_fuses_the_activation_to_the_same_bits(activation, placement, dtype,
                                                                                    monkeypatch):
    """A tuned pass that keeps no hidden layer multiplies a layer's query, key and value weights (with
    their biases) as one product, and applies the activation inside W_1's product, where our product has
    it (GPT-2's tanh GELU, BERT's exact one in float32; not ReLU): the logits, to the bit, of the pass that
    multiplies every weight alone and runs the activation as a pass of its own. A pass that keeps the
    hidden layer takes that way."""
    cfg = dataclasses.replace(presets.gpt2(**SETTINGS), activation=activation, norm_placement=placement)
    params = C.init_params(cfg, seed=5, dtype=dtype)
    rng = np.random.default_rng(2)
    for name, value in params.items():
        if name.rsplit(".", 1)[-1].startswith("b_"):
            params[name] = (0.1 * rng.normal(size=value.shape)).astype(dtype)
    L.pack_weights(params, transposed=("embed",))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 9))
    ran = {"joined": 0, "activated": []}
    joined, activated = L.dense_joined, L.dense_activated

    def counting_joined(*args, **kwargs):
        y = joined(*args, **kwargs)
        ran["joined"] += y is not None
        return y

    def counting_activated(x, W, b, act):
        y = activated(x, W, b, act)
        if y is not None:
            ran["activated"].append(act)
        return y

    monkeypatch.setattr(L, "dense_joined", counting_joined)
    monkeypatch.setattr(L, "dense_activated", counting_activated)
    lean, _ = tr.forward(params, cfg, ids, keep=())
    fused = activation != "relu" and not (activation == "gelu_erf" and dtype == np.float64)
    assert ran == {"joined": cfg.n_layers, "activated": [activation] * cfg.n_layers if fused else []}

    monkeypatch.setattr(L, "dense_joined", lambda *args, **kwargs: None)
    monkeypatch.setattr(L, "dense_activated", lambda *args: None)
    apart, _ = tr.forward(params, cfg, ids, keep=())
    assert np.array_equal(lean, apart)

    monkeypatch.setattr(L, "dense_joined", counting_joined)
    monkeypatch.setattr(L, "dense_activated", counting_activated)
    ran["activated"] = []
    _, cache = tr.forward(params, cfg, ids, keep=("ffn.pre",))
    assert ran["activated"] == [] and {f"blocks.{i}.ffn.pre" for i in range(cfg.n_layers)} <= set(cache)


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


# In a fresh process: the warm-up's step for the models' compiled loops, then a packed model's passes
# (the page's, one keeping nothing, one keeping the weights), GPT-2's and BERT's activations, over a
# text and a generated token; prints the product kernels they compiled anew.
AFTER_THE_WARM_UP = """
import dataclasses, json
import numpy as np
from core import warmup
from core.kernels.tuned import gemm
from core.model import config as C, layers as L, presets, transformer as tr
warmup._readable_loops()
kernels = {"matmul": gemm._matmul, "few_rows": gemm._matmul_few, "joined": gemm._matmul_joined,
           "gelu_erf": L._gelu_erf_rational}
before = {name: len(k.signatures) for name, k in kernels.items()}
for activation, placement in (("gelu_tanh", "pre"), ("gelu_erf", "post")):
    cfg = dataclasses.replace(presets.gpt2(vocab_size=1000, n_ctx=64, d_model=384, n_heads=6, n_layers=1),
                              activation=activation, norm_placement=placement)
    params = C.init_params(cfg, seed=1, dtype=np.float32)
    L.pack_weights(params, transposed=("embed",))
    for T in (40, 2):
        ids = np.arange(T)
        for keep in (None, (), ("attn.weights",)):
            tr.forward(params, cfg, ids, keep=keep)
print(json.dumps(sorted(name for name, k in kernels.items() if len(k.signatures) != before[name])))
"""


def test_the_warm_up_compiles_what_a_packed_models_passes_run():
    """A packed weight's panels are read-only arrays, a joined product's a tuple of them: types of
    their own to Numba. The warm-up compiles them, so no pass of a page compiles on its thread."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    run = subprocess.run([sys.executable, "-c", AFTER_THE_WARM_UP], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
