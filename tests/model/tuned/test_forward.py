"""The tuned twins of the transformer's elementwise steps (core.model.tuned.forward) against the
readable steps they replace at GPT-2's sizes, in float32 and float64; and a model above BLAS_FROM,
which runs them, against itself with and without the KV cache."""
import numpy as np
import pytest

from core import masks
from core.model import layers as L
from core.model import multi_head as MH
from core.model import positions as POS
from core.model import transformer as tr
from core.model import config as C
from core.model.tuned import forward as TF
from core.model.activations import ACTIVATIONS

DTYPES = [np.float64, np.float32]
TOL = {np.float64: dict(rtol=1e-12, atol=1e-14), np.float32: dict(rtol=2e-6, atol=1e-7)}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 3, 5, 7), (2, 12, 9, 9), (1, 4, 3, 70), (1, 2, 1, 33)])
def test_softmax_twin_matches_the_readable_rows(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    S = (6 * rng.standard_normal(shape)).astype(dtype)
    Tq, Tk = shape[-2:]
    S += masks.causal(Tq, dtype, start=Tk - Tq)              # -inf above the diagonal, never a whole row
    A = TF.softmax_rows(S)
    assert A.dtype == dtype and A.shape == S.shape
    np.testing.assert_allclose(A, MH.softmax_rows(S), **TOL[dtype])
    assert np.all(A[np.isneginf(S)] == 0)                    # masked entries exactly 0
    np.testing.assert_allclose(A.sum(-1), 1, rtol=0, atol=10 * np.finfo(dtype).eps * Tk)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_softmax_twin_gives_zeros_for_a_row_with_nothing_allowed(dtype):
    S = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]], dtype=dtype)
    A = TF.softmax_rows(S)
    assert np.all(A[0] == 0) and A[1, 1] == 0 and not np.isnan(A).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5, 64), (2, 9, 3072)])
def test_gelu_twin_matches_the_readable_tanh_form(shape, dtype):
    rng = np.random.default_rng(len(shape))
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    x.flat[0] = -30.0                                         # far out on both sides, and 0
    if x.size > 2:
        x.flat[1], x.flat[2] = 30.0, 0.0
    y = TF.gelu_tanh(x)
    assert y.dtype == dtype and y.shape == x.shape
    ref = L.gelu_tanh(x)
    # float32: the readable 1 + tanh(u) rounds to 0 for x below about -4.5; the twin keeps those tiny values
    np.testing.assert_allclose(y, ref, rtol=TOL[dtype]["rtol"] * 4, atol=TOL[dtype]["atol"] * 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1,), (7,), (2, 9, 1536)])
def test_silu_twin_matches_the_readable_form(shape, dtype):
    rng = np.random.default_rng(len(shape) + 5)
    x = (6 * rng.standard_normal(shape)).astype(dtype)
    x.flat[0] = -100.0                                        # beyond exp's cap: 0 either way, and 0 itself
    if x.size > 2:
        x.flat[1], x.flat[2] = 100.0, 0.0
    y = TF.silu(x)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y, ACTIVATIONS["silu"].forward(x), **TOL[dtype])
    with L.recording() as ran:                                # a tuned pass runs the twin and says so
        assert np.array_equal(ACTIVATIONS["silu"].forward(x, True), y)
    assert TF.silu in ran.functions()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 13), (2, 5, 576)])
def test_rms_norm_twin_matches_the_readable_rows(shape, dtype):
    rng = np.random.default_rng(shape[-1])
    x = (3 * rng.standard_normal(shape)).astype(dtype)
    g = (1 + 0.3 * rng.standard_normal(shape[-1])).astype(dtype)
    got, want = TF.rms_norm(x, g, 1e-5), L.rms_norm(x, g, 1e-5)
    for a, b in zip(got, want):                                       # y, x / rms, rms
        assert a.dtype == dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape,start", [((1, 1, 1, 2), 0), ((1, 3, 5, 8), 7), ((2, 9, 33, 64), 0)])
def test_rotate_twin_gives_the_readable_rotation_to_the_bit(shape, start, dtype):
    """The same products and sums, one pass: the same bits, on the strided views split_heads gives."""
    rng = np.random.default_rng(shape[2])
    B, H, T, d_k = shape
    x = rng.standard_normal((B, T, H, d_k)).astype(dtype).transpose(0, 2, 1, 3)      # (B, H, T, d_k), strided
    cos, sin = POS.rotary_angles(start, T, d_k, 100_000.0, dtype)
    y = TF.rotate(x, cos, sin)
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_array_equal(y, POS.rotate(x, cos, sin))
    assert not cos.flags.writeable and POS.rotary_angles(start, T, d_k, 100_000.0, dtype)[0] is cos   # kept


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_append_kv_gives_the_concatenation_and_forks_do_not_overwrite_each_other(dtype):
    rng = np.random.default_rng(0)
    new = lambda T: rng.standard_normal((1, 2, T, 3)).astype(dtype)     # noqa: E731
    kv, K_all, V_all = {}, np.zeros((1, 2, 0, 3), dtype), np.zeros((1, 2, 0, 3), dtype)
    for T in (5, 1, 1, 60, 1, 100):                                      # grows past its room twice
        K, V = new(T), new(T)
        K_all, V_all = np.concatenate([K_all, K], axis=2), np.concatenate([V_all, V], axis=2)
        got_K, got_V = TF.append_kv(kv, K, V)
        np.testing.assert_array_equal(got_K, K_all)
        np.testing.assert_array_equal(got_V, V_all)
        assert kv["K"] is got_K and kv["V"] is got_V
    a, b = dict(kv), dict(kv)                                            # two continuations of one prefix
    Ka, Kb = new(1), new(1)
    TF.append_kv(a, Ka, new(1))
    TF.append_kv(b, Kb, new(1))
    np.testing.assert_array_equal(a["K"][:, :, -1:], Ka)
    np.testing.assert_array_equal(b["K"][:, :, -1:], Kb)
    np.testing.assert_array_equal(kv["K"], K_all)                        # the prefix itself untouched


BIG = C.TransformerConfig(vocab_size=50, n_ctx=160, d_model=512, n_heads=8, d_ff=512, n_layers=1, norm_placement="pre",
                           activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_a_model_of_blas_size_runs_the_twins_and_its_kv_cache_gives_the_full_forward(dtype, monkeypatch):
    assert BIG.d_model ** 2 >= L.BLAS_FROM
    params = C.init_params(BIG, seed=3, dtype=dtype)
    ids = np.random.default_rng(1).integers(0, BIG.vocab_size, size=(1, 75))
    full, cache = tr.forward(params, BIG, ids)
    kv = [{} for _ in range(BIG.n_layers)]
    first, _ = tr.forward(params, BIG, ids[:, :60], kv=kv)
    steps = [tr.forward(params, BIG, ids[:, t:t + 1], kv=kv, start=t)[0] for t in range(60, 75)]   # past 64: grows
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.concatenate([first] + steps, axis=1), full, **tol)
    # the same forward with the readable steps in place of the twins
    monkeypatch.setattr(TF, "softmax_rows", MH.softmax_rows)
    monkeypatch.setattr(TF, "gelu_tanh", L.gelu_tanh)
    readable, rcache = tr.forward(params, BIG, ids)
    np.testing.assert_allclose(full, readable, **tol)
    np.testing.assert_allclose(cache["blocks.0.attn.weights"], rcache["blocks.0.attn.weights"], **tol)


GQA = C.TransformerConfig(vocab_size=50, n_ctx=160, d_model=384, n_heads=6, n_kv_heads=2, d_ff=64, n_layers=2,
                          norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary",
                          rope_base=100.0, tied_unembed=True, final_ln=True, bias=False)
ENCODER = C.TransformerConfig(vocab_size=50, n_ctx=160, d_model=384, n_heads=6, d_ff=64, n_layers=2, causal=False,
                              head="none", activation="gelu_erf", embed_ln=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("cfg", [GQA, BIG, ENCODER], ids=["grouped-causal", "gpt2-like", "encoder-padded"])
def test_a_pass_keeping_no_attention_weights_computes_the_heads_without_them(cfg, dtype):
    """``keep=()`` takes the fused kernel (no (Tq, Tk) weights written) and gives the pass that keeps
    them: the same logits and head outputs, with grouped query heads, rotary positions, the causal
    mask, padding keys and a head ablated (its mean over the real positions)."""
    params = C.init_params(cfg, seed=4, dtype=dtype)
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(2, 70))
    key_mask = np.ones((2, 70), np.int64)
    key_mask[1, 50:] = 0                                             # the second sentence is padded
    kw = dict(ablate={(cfg.n_layers - 1, 2): "mean"}, key_mask=key_mask)
    with L.recording() as ran:
        full, cache = tr.forward(params, cfg, ids, **kw)
    assert TF.attention not in ran.functions()
    with L.recording() as ran:
        lean, lean_cache = tr.forward(params, cfg, ids, keep=("attn.head_outputs",), **kw)
    assert TF.attention in ran.functions() and TF.softmax_rows not in ran.functions()
    assert "blocks.0.attn.weights" not in lean_cache
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-5)
    for layer in range(cfg.n_layers):
        name = f"blocks.{layer}.attn.head_outputs"
        np.testing.assert_allclose(lean_cache[name], cache[name], **tol)
    real = key_mask.astype(bool)                                     # padded positions' outputs are not compared
    np.testing.assert_allclose(lean[real], full[real], **tol)
