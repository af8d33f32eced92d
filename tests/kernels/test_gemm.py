"""Our matrix product: the tuned one (weights packed into panels, register tiles, both cores, fused
bias, activation and residual), its readable twin, and the register tile the training steps use,
each held to NumPy's product in float64 on odd shapes, in float32 and float64."""
import math

import numba
import numpy as np
import pytest

from core.kernels.matmul import ACTIVATIONS as ACTIVATION_CODES, matmul_kernel
from core.kernels.tuned import gemm
from core.model.tuned.products import project

# rows: one generated token, 2-3 (fewer than a tile), a tile exactly, odd counts; columns: fewer
# than one panel, a panel exactly (64 = 4 AVX-512 vectors, a multiple of AVX2's 24: see the ids),
# one past it, several panels and a padded last one, a single whole panel below a moved row block
SHAPES = [(1, 7, 5), (2, 33, 70), (3, 64, 24), (4, 8, 64), (5, 17, 65), (17, 61, 200), (37, 129, 130),
          (64, 96, 192), (9, 16, 32), (9, 16, 64)]
ACTIVATIONS = {"none": lambda z: z,
               "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))),
               "silu": lambda z: z / (1 + np.exp(-z)),
               "gelu_erf": lambda z: 0.5 * z * (1 + np.vectorize(math.erf)(z / np.sqrt(2)))}
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-12}


def _inputs(M, K, N, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x, W = rng.normal(size=(M, K)), rng.normal(size=(K, N)) / np.sqrt(K)
    b, r = rng.normal(size=N), rng.normal(size=(M, N))
    return [a.astype(dtype) for a in (x, W, b, r)]


def _expected(x, W, b, activation, r):
    z = x.astype(np.float64) @ W.astype(np.float64)
    if b is not None:
        z = z + b
    z = ACTIVATIONS[activation](z)
    return z if r is None else z + r


def _assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert err < TOLERANCE[dtype], err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_packed_product_matches_numpy(M, K, N, dtype):
    x, W, b, r = _inputs(M, K, N, dtype)
    packed = gemm.pack(W)
    _assert_close(gemm.matmul(x, packed), _expected(x, W, None, "none", None), dtype)
    for activation in ACTIVATIONS:
        if activation == "gelu_erf" and dtype == np.float64:
            with pytest.raises(ValueError, match="exact GELU is float32's"):
                gemm.matmul(x, packed, b, activation)
            continue
        _assert_close(gemm.matmul(x, packed, b, activation, r), _expected(x, W, b, activation, r), dtype)
    _assert_close(gemm.matmul(x, packed, b), _expected(x, W, b, "none", None), dtype)
    _assert_close(gemm.matmul(x, packed, residual=r), _expected(x, W, None, "none", r), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cache_blocked_product_gives_the_unblocked_products_bits(dtype):
    """Many rows and a long K take K in chunks (a moved last row block, a padded last panel, the
    epilogue after the last chunk): the bits of the product over fewer rows at a time, which does not
    block, and NumPy's numbers."""
    M, K, N = gemm.BLOCKED_FROM_ROWS + 2, gemm.BLOCKED_FROM_K + 75, 130
    x, W, b, r = _inputs(M, K, N, dtype)
    packed = gemm.pack(W)
    assert gemm._call(x, packed, b, "none", r)[0] is gemm._matmul_blocked
    rows = gemm.BLOCKED_FROM_ROWS // 2
    for activation in ("none", "gelu_tanh"):
        got = gemm.matmul(x, packed, b, activation, r)
        apart = [gemm.matmul(x[i:i + rows], packed, b, activation, r[i:i + rows]) for i in range(0, M, rows)]
        assert np.array_equal(got, np.concatenate(apart))
        _assert_close(got, _expected(x, W, b, activation, r), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,widths", [(4, 8, (5, 70, 3)), (37, 129, (64, 130, 200)), (9, 16, (64, 64)),
                                         (70, 96, (96,))])
def test_weights_joined_in_one_product_give_each_ones_product_to_the_bit(M, K, widths, dtype):
    """A layer's query, key and value weights as one product: each weight's outputs side by side, the
    bits of its own product (with its slice of the bias), and NumPy's numbers; widths that end inside
    a panel, a moved last row block. Fewer rows than a tile, or another height, give None."""
    rng = np.random.default_rng(M + K)
    x = rng.normal(size=(M, K)).astype(dtype)
    Ws = [rng.normal(size=(K, n)).astype(dtype) for n in widths]
    bs = [rng.normal(size=n).astype(dtype) for n in widths]
    packed = [gemm.pack(W) for W in Ws]
    got = gemm.joined_matmul_if_loaded(x, packed, np.concatenate(bs))
    assert np.array_equal(got, np.concatenate([gemm.matmul(x, P, b) for P, b in zip(packed, bs)], axis=1))
    _assert_close(got, _expected(x, np.concatenate(Ws, axis=1), np.concatenate(bs), "none", None), dtype)
    assert np.array_equal(gemm.joined_matmul_if_loaded(x, packed),
                          np.concatenate([gemm.matmul(x, P) for P in packed], axis=1))
    assert gemm.joined_matmul_if_loaded(x[:gemm.TILE_ROWS - 1], packed) is None
    assert gemm.joined_matmul_if_loaded(x, packed + [gemm.pack(np.ones((K + 1, 3), dtype))]) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("B,M,K,N", [(1, 4, 8, 5), (3, 9, 64, 70), (12, 37, 32, 37), (3, 96, 64, 130), (2, 5, 3, 200)])
def test_batched_product_matches_numpy(B, M, K, N, dtype):
    """Attention's products, a batch per head (or group of heads), each batch's right side packed in the
    kernel; odd row counts (a moved last row block) and odd widths (a padded last panel)."""
    rng = np.random.default_rng(B + M + K + N)
    x, b = rng.normal(size=(B, M, K)).astype(dtype), rng.normal(size=(B, K, N)).astype(dtype)
    got = gemm.matmul_batched_if_loaded(x, b.swapaxes(1, 2).copy().swapaxes(1, 2))   # a strided right side
    _assert_close(got, x.astype(np.float64) @ b.astype(np.float64), dtype)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert np.array_equal(gemm.matmul_batched_if_loaded(x, b), got)       # each tile one thread's
    finally:
        numba.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packing_keeps_every_weight_and_pads_with_zeros(dtype):
    W = _inputs(3, 11, 70, dtype)[1]
    packed = gemm.pack(W)
    width = gemm.panel_width(dtype)
    P = -(-70 // width)
    assert packed.shape == (11, 70) and packed.dtype == dtype and packed.panels.shape == (P, 11, width)
    widened = packed.panels.transpose(1, 0, 2).reshape(11, P * width)
    assert np.array_equal(widened[:, :70], W) and not widened[:, 70:].any()
    assert not packed.panels.flags.writeable


def test_the_numbers_do_not_depend_on_the_thread_count():
    """Each tile is one thread's, its sums in one order: the same bits on one thread as on all."""
    x, W, b, r = _inputs(37, 129, 300, np.float32, seed=1)
    packed = gemm.pack(W)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = gemm.matmul(x, packed, b, "gelu_tanh", r)
        numba.set_num_threads(threads)
        assert np.array_equal(gemm.matmul(x, packed, b, "gelu_tanh", r), one)
    finally:
        numba.set_num_threads(threads)


def test_a_weight_of_another_height_is_refused():
    x, W, _, _ = _inputs(5, 8, 9, np.float32)
    with pytest.raises(ValueError, match="x has 7 columns, the weight 8 rows"):
        gemm.matmul(x[:, :7], gemm.pack(W))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_readable_twin_matches_numpy(activation, dtype):
    x, W, b, _ = _inputs(5, 9, 7, dtype)
    out = np.empty((5, 7), dtype)
    matmul_kernel(x, W, b, ACTIVATION_CODES.index(activation), out)
    _assert_close(out, _expected(x, W, b, activation, None), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", [(3, 5, 7), (4, 9, 48), (9, 33, 70), (17, 40, 130)])
def test_the_training_steps_register_tile_matches_numpy(M, K, N, dtype):
    """``project``: ``Y = A^T X`` and ``Y = Y0 + A^T X``, the same tiles on W's own rows (unpacked)."""
    rng = np.random.default_rng(2)
    A, X, Y0 = (rng.normal(size=s).astype(dtype) for s in ((K, M), (K, N), (M, N)))
    Y = np.empty((M, N), dtype)
    project(A, X, Y0, Y, False)
    _assert_close(Y, A.T.astype(np.float64) @ X, dtype)
    project(A, X, Y0, Y, True)
    _assert_close(Y, Y0 + A.T.astype(np.float64) @ X, dtype)
