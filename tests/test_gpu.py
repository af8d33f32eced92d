"""CUDA kernels (``core.kernels.tuned.gpu``) against the NumPy reference.

Without a GPU these run on Numba's CUDA simulator (conftest.py), one Python thread per GPU
thread: shapes are tiny, and tiles and blocks are patched small so that several blocks, partial
last tiles and idle threads all occur.
"""
import numpy as np
import pytest

from core.kernels.tuned import gpu
from core.kernels import reference as ref

TOL = {np.float32: 1e-5, np.float64: 1e-12}

# (B, H, Tq, Tk, d_k, d_v); with TILE = THREADS = 4: several query blocks, key tiles, some partial
SHAPES = {
    "T1": (1, 1, 1, 1, 2, 3),
    "square": (1, 2, 6, 6, 4, 3),        # T not a multiple of the tile
    "cross": (2, 1, 5, 9, 3, 2),         # Tq != Tk, batched
    "batched": (2, 3, 9, 9, 3, 4),       # B > 1 and H > 1
}

# (shape, mask): together they broadcast the mask in every dimension, and mask whole rows
CASES = [
    ("T1", "none"), ("T1", "causal"),
    ("square", "none"), ("square", "causal"), ("square", "rows_per_head"),
    ("cross", "none"), ("cross", "padding"), ("cross", "random"),
    ("batched", "causal"), ("batched", "padding"), ("batched", "random"),
]


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Tiles of 4 and blocks of 4 threads, so tiny inputs still span several blocks."""
    monkeypatch.setattr(gpu, "TILE", 4)
    monkeypatch.setattr(gpu, "THREADS", 4)


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


def make_mask(name, B, H, Tq, Tk, rng, dtype):
    """A 4-D additive mask ``(Bm, Hm, Tqm, Tkm)``, each dim 1 or full size."""
    if name == "none":
        M = np.zeros((1, 1, 1, 1))
    elif name == "causal":                        # (1, 1, T, T)
        assert Tq == Tk
        M = ref.causal_mask(Tq)[None, None]
    elif name == "padding":                       # (B, 1, 1, Tk); the first sequence is padded
        assert B >= 2 and Tk >= 5                 # (several live keys), the last one empty
        lengths = [Tk - 3] + [Tk] * (B - 2) + [0]
        M = ref.padding_mask(lengths, Tk)[:, :, None, :]
    elif name == "rows_per_head":                 # (1, H, Tq, 1): head 0, query 1 sees nothing
        M = np.zeros((1, H, Tq, 1))
        M[0, 0, 1, 0] = -np.inf
    elif name == "random":                        # (B, H, Tq, Tk): finite values, holes, a dead row
        M = rng.normal(scale=2.0, size=(B, H, Tq, Tk))
        M[rng.random(M.shape) < 0.3] = -np.inf
        M[-1, -1, 0, :] = -np.inf
    else:
        raise KeyError(name)
    return M.astype(dtype)


def make_case(shape_name, mask_name, dtype, seed=0):
    """Q, K, V, mask and scale for one test case."""
    B, H, Tq, Tk, d_k, d_v = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((B, H, Tq, d_k)).astype(dtype)
    K = rng.standard_normal((B, H, Tk, d_k)).astype(dtype)
    V = rng.standard_normal((B, H, Tk, d_v)).astype(dtype)
    mask = make_mask(mask_name, B, H, Tq, Tk, rng, dtype)
    return Q, K, V, mask, d_k ** -0.5            # a Python float: keeps float32 in float32


def assert_close(actual, desired, dtype):
    assert actual.dtype == dtype
    assert actual.shape == desired.shape
    np.testing.assert_allclose(actual, desired, rtol=TOL[dtype], atol=TOL[dtype])


def assert_weight_invariants(A, mask):
    """No NaN; rows sum to 1 (0 where everything is masked); masked weights exactly 0."""
    masked = np.broadcast_to(mask == -np.inf, A.shape)
    assert not np.isnan(A).any()
    assert (A[masked] == 0).all()
    dead_rows = masked.all(axis=-1)
    np.testing.assert_allclose(A.sum(axis=-1), np.where(dead_rows, 0.0, 1.0), atol=1e-5)
    assert (A[dead_rows] == 0).all()


# --------------------------------------------------------------------------- attention kernels

@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_scaled_scores(shape_name, mask_name, dtype):
    Q, K, _, mask, scale = make_case(shape_name, mask_name, dtype)
    assert_close(gpu.scaled_scores(Q, K, mask, scale), ref.scaled_scores(Q, K, mask, scale), dtype)


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_softmax_rows(shape_name, mask_name, dtype):
    Q, K, _, mask, scale = make_case(shape_name, mask_name, dtype)
    S = ref.scaled_scores(Q, K, mask, scale)
    A = gpu.softmax_rows(S)
    assert_close(A, ref.softmax(S), dtype)
    assert_weight_invariants(A, mask)


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_attention_weights(shape_name, mask_name, dtype):
    Q, K, _, mask, scale = make_case(shape_name, mask_name, dtype)
    A = gpu.attention_weights(Q, K, mask, scale)
    assert_close(A, ref.softmax(ref.scaled_scores(Q, K, mask, scale)), dtype)
    assert_weight_invariants(A, mask)


@pytest.mark.parametrize("shape_name, mask_name", [c for c in CASES if c[1] in ("none", "random")])
def test_weighted_sum(shape_name, mask_name, dtype):
    Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
    A = ref.softmax(ref.scaled_scores(Q, K, mask, scale))
    assert_close(gpu.weighted_sum(A, V), A @ V, dtype)


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_fused_attention(shape_name, mask_name, dtype):
    Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
    out = gpu.fused_attention(Q, K, V, mask, scale)
    assert_close(out, ref.attention(Q, K, V, mask, scale)[0], dtype)
    # a query that may look nowhere outputs exactly zero
    dead_rows = np.broadcast_to(mask == -np.inf, Q.shape[:3] + (K.shape[2],)).all(axis=-1)
    assert (out[dead_rows] == 0).all()


def test_masks_really_mask_rows(dtype):
    """Guard against vacuous invariants: the cases above do contain fully masked rows."""
    for shape_name, mask_name in (("square", "rows_per_head"), ("batched", "random")):
        Q, K, _, mask, scale = make_case(shape_name, mask_name, dtype)
        A = gpu.attention_weights(Q, K, mask, scale)
        assert (A.sum(axis=-1) == 0).sum() == 1


@pytest.mark.parametrize("shape_name", [s for s, m in CASES if m == "padding"])
def test_padding_rows_weigh_several_keys_across_key_tiles(shape_name):
    """Guard: a padded row that allows anything allows several keys, spread over more than one key
    tile (so its weights depend on the scale and the online softmax rescales), and the empty
    sequence's rows allow nothing."""
    B, H, Tq, Tk, _, _ = SHAPES[shape_name]
    mask = make_mask("padding", B, H, Tq, Tk, np.random.default_rng(0), np.float64)
    live = np.broadcast_to(np.isfinite(mask), (B, H, Tq, Tk)).sum(-1)
    assert live[0].min() >= 2 and (live[0].max() - 1) // gpu.TILE >= 1
    assert (live[-1] == 0).all()


@pytest.mark.parametrize("tile, threads", [(1, 1), (3, 5), (16, 2)])
def test_fused_attention_any_tile_size(monkeypatch, tile, threads):
    """Patching TILE/THREADS builds a new kernel, and every size gives the same answer."""
    monkeypatch.setattr(gpu, "TILE", tile)
    monkeypatch.setattr(gpu, "THREADS", threads)
    Q, K, V, mask, scale = make_case("cross", "random", np.float64)
    assert_close(gpu.fused_attention(Q, K, V, mask, scale), ref.attention(Q, K, V, mask, scale)[0],
                 np.float64)


def test_fused_attention_wide_heads_get_shorter_tiles(monkeypatch):
    """K/V tiles that would overflow shared memory shrink (here to one key) and stay correct."""
    monkeypatch.setattr(gpu, "SHARED_BYTES", 1)
    Q, K, V, mask, scale = make_case("square", "causal", np.float32)
    assert_close(gpu.fused_attention(Q, K, V, mask, scale), ref.attention(Q, K, V, mask, scale)[0],
                 np.float32)


def test_float64_mask_does_not_promote_float32():
    """The mask is brought to the data's dtype, so float32 stays float32 end to end."""
    Q, K, V, mask, scale = make_case("square", "causal", np.float32)
    mask64 = mask.astype(np.float64)
    assert_close(gpu.attention_weights(Q, K, mask64, scale),
                 gpu.attention_weights(Q, K, mask, scale), np.float32)
    assert gpu.fused_attention(Q, K, V, mask64, scale).dtype == np.float32


def test_huge_finite_scores_are_stable(dtype):
    """Scores of +-1e30 give finite weights summing to 1 (the max is subtracted first)."""
    B, H, Tq, Tk, d_k, d_v = 1, 1, 3, 5, 2, 2
    rng = np.random.default_rng(1)
    Q = rng.standard_normal((B, H, Tq, d_k)).astype(dtype)
    K = rng.standard_normal((B, H, Tk, d_k)).astype(dtype)
    V = rng.standard_normal((B, H, Tk, d_v)).astype(dtype)
    mask = np.zeros((1, 1, Tq, Tk), dtype)
    mask[0, 0, 0, 1] = 1e30                         # one key dominates completely
    mask[0, 0, 1, :] = [1e30, 1e30, -1e30, -np.inf, 0.0]   # a tie at the top
    mask[0, 0, 2, 4] = -1e30

    A = gpu.attention_weights(Q, K, mask, 1.0)
    assert np.isfinite(A).all()
    np.testing.assert_allclose(A.sum(axis=-1), 1.0, rtol=TOL[dtype])
    np.testing.assert_array_equal(A[0, 0, 0], [0, 1, 0, 0, 0])
    np.testing.assert_allclose(A[0, 0, 1], [0.5, 0.5, 0, 0, 0], rtol=TOL[dtype])
    assert_close(gpu.softmax_rows(ref.scaled_scores(Q, K, mask, 1.0)), A, dtype)

    out = gpu.fused_attention(Q, K, V, mask, 1.0)
    assert np.isfinite(out).all()
    assert_close(out, ref.attention(Q, K, V, mask, 1.0)[0], dtype)
    np.testing.assert_allclose(out[0, 0, 0], V[0, 0, 1], rtol=TOL[dtype])


# --------------------------------------------------------------------------- projections

# (B, T, d_in, H, d): T and the matmul sizes are not multiples of TILE = 4
PROJECTIONS = [(1, 1, 3, 1, 2), (2, 5, 6, 3, 3), (1, 7, 9, 2, 5)]


@pytest.mark.parametrize("B, T, d_in, H, d", PROJECTIONS)
def test_project_heads(B, T, d_in, H, d, dtype):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((B, T, d_in)).astype(dtype)
    W = rng.standard_normal((d_in, H * d)).astype(dtype)
    b = rng.standard_normal(H * d).astype(dtype)
    assert_close(gpu.project_heads(X, W, b, H), ref.split_heads(X @ W + b, H), dtype)


@pytest.mark.parametrize("B, T, d_out, H, d", PROJECTIONS)
def test_merge_heads_project(B, T, d_out, H, d, dtype):
    rng = np.random.default_rng(3)
    O = rng.standard_normal((B, H, T, d)).astype(dtype)
    W_O = rng.standard_normal((H * d, d_out)).astype(dtype)
    b_O = rng.standard_normal(d_out).astype(dtype)
    assert_close(gpu.merge_heads_project(O, W_O, b_O), ref.merge_heads(O) @ W_O + b_O, dtype)


# --------------------------------------------------------------------------- positional encoding

@pytest.mark.parametrize("T, d_model, base", [(1, 1, 10000.0), (9, 7, 10000.0), (6, 8, 100.0)])
def test_sinusoidal(T, d_model, base, dtype):
    PE = gpu.sinusoidal(T, d_model, base, dtype)
    assert_close(PE, ref.sinusoidal(T, d_model, base).astype(dtype), dtype)
