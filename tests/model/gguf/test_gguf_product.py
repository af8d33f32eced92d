"""The product read in the packed form (core.model.gguf.product) against its readable twin, the
widened matrix's product: every block format it multiplies, few rows and many, odd sizes, a row
order, a bias; the unpacked weights are the widening loops' to the bit."""
import numba
import numpy as np
import pytest

from core.model import layers as L
from core.model import transformer as tr
from core.model.gguf import product as P
from core.model.gguf.matrix import MATRICES
from core.model.gguf.quants import FORMATS, dequantize

BY_NAME = {f.name: f for f in FORMATS.values()}


def random_rows(fmt: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Packed rows of random codes, with random finite half-precision scales (and mins): every
    bit pattern a code can take, not only what a quantiser writes."""
    f = BY_NAME[fmt]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // 32, f.nbytes), dtype=np.uint8)
    halves = 2 if fmt == "Q4_1" else 1
    scales = rng.uniform(-0.1, 0.1, size=(rows, cols // 32, halves)).astype(np.float16)
    raw[:, :, :2 * halves] = scales.view(np.uint8).reshape(rows, cols // 32, 2 * halves)
    raw = raw.reshape(rows, -1)
    raw.setflags(write=False)                    # as the memory map gives them
    return raw


def reference(x, raw, fmt, order, bias=None):
    """``x @ R^T + bias`` in float64 from the widened rows, and ``|x| @ |R|^T`` (the size of the sums)."""
    R = dequantize(raw, BY_NAME[fmt], order).astype(np.float64)        # (N, K)
    y = x.astype(np.float64) @ R.T
    return (y if bias is None else y + bias), np.abs(x) @ np.abs(R).T


@pytest.mark.parametrize("fmt", list(P.FORMATS))
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 63, 64, 65, 130])
def test_the_product_is_the_widened_matrix_product(fmt, M):
    K, N = 96, 23                                # N not a multiple of the four outputs a task takes
    raw = random_rows(fmt, N + 4, K, seed=M)
    order = np.random.default_rng(M).permutation(N + 4)[:N]                # output n reads row order[n]
    x = np.random.default_rng(M + 1).standard_normal((M, K)).astype(np.float32)
    bias = np.random.default_rng(M + 2).standard_normal(N).astype(np.float32)
    for b in (None, bias):
        y = P.rows_product(x, raw, order, fmt, b)
        want, size = reference(x, raw, fmt, order, b)
        assert y.shape == (M, N) and y.dtype == np.float32
        assert np.all(np.abs(y - want) <= 2e-6 * (size + 1)), (fmt, M, np.abs(y - want).max())


@pytest.mark.parametrize("fmt", list(P.FORMATS))
@pytest.mark.parametrize("M", [2, 96])
def test_the_weights_are_the_widening_loops_to_the_bit(fmt, M):
    """Rows of the identity pick single weights: each output is one weight times 1 plus zeros, so
    the product shows the unpacked weights themselves, on the few-row path and the tiled one."""
    K, N = 96, 9
    raw = random_rows(fmt, N, K, seed=3)
    order = np.arange(N)[::-1].copy()
    rows = np.arange(M) % K
    x = np.eye(K, dtype=np.float32)[rows]                               # (M, K)
    y = P.rows_product(x, raw, order, fmt)
    assert np.array_equal(y, dequantize(raw, BY_NAME[fmt], order).T[rows])


def test_the_numbers_do_not_depend_on_the_thread_count():
    raw = random_rows("Q4_1", 40, 128, seed=5)
    order = np.arange(40)
    threads = numba.get_num_threads()
    for M in (1, 70):
        x = np.random.default_rng(M).standard_normal((M, 128)).astype(np.float32)
        try:
            numba.set_num_threads(1)
            one = P.rows_product(x, raw, order, "Q4_1")
            numba.set_num_threads(threads)
            assert np.array_equal(P.rows_product(x, raw, order, "Q4_1"), one)
        finally:
            numba.set_num_threads(threads)


def test_other_formats_and_other_widths_are_refused():
    raw = random_rows("Q4_1", 4, 64)
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match="No packed product for Q4_K"):
        P.rows_product(x, raw, np.arange(4), "Q4_K")
    with pytest.raises(ValueError, match="x has 32 columns"):
        P.rows_product(x[:, :32], raw, np.arange(4), "Q4_1")


@pytest.mark.parametrize("fmt", list(P.FORMATS))
def test_a_linear_layer_and_a_tied_unembedding_multiply_the_compact_form(fmt):
    """``dense`` with a compact weight and ``tied_logits`` with a compact token table give the
    widened products' numbers and leave the widening unused; float64 widens as before, exactly."""
    K, N = 64, 40
    raw = random_rows(fmt, N, K, seed=7)
    order = np.random.default_rng(7).permutation(N)
    W = MATRICES[fmt](raw, transposed=True, row_order=order)              # (K, N): x @ W
    E = MATRICES[fmt](raw, transposed=False)                              # (N, K): a token table
    assert W.multiplies() and E.multiplies(transposed=True) and not E.multiplies()
    h = np.random.default_rng(8).standard_normal((2, 5, K)).astype(np.float32)
    widened = {"n": 0}

    def counting(matrix):
        widen = matrix.widen
        matrix.widen = lambda: (widened.__setitem__("n", widened["n"] + 1), widen())[1]

    counting(W), counting(E)
    b = np.linspace(-1, 1, N, dtype=np.float32)
    y = L.dense(h, W, b)
    want, size = reference(h.reshape(-1, K), raw, fmt, order, b)
    assert y.shape == (2, 5, N) and np.all(np.abs(y.reshape(-1, N) - want) <= 2e-6 * (size + 1))
    logits = tr.tied_logits(h, E)
    want, size = reference(h.reshape(-1, K), raw, fmt, np.arange(N))
    assert logits.shape == (2, 5, N) and np.all(np.abs(logits.reshape(-1, N) - want) <= 2e-6 * (size + 1))
    assert widened["n"] == 0
    assert tr.block_params({"blocks.0.attn.W_Q": W}, "blocks.0.")["attn.W_Q"] is W          # kept compact
    assert isinstance(tr.block_params({"blocks.0.attn.W_Q": W}, "blocks.0.", widen=True)["attn.W_Q"], np.ndarray)
    W64 = MATRICES[fmt](raw, transposed=True, row_order=order, dtype=np.float64)
    assert not W64.multiplies() and W64.product(h[0].astype(np.float64)) is None
    np.testing.assert_allclose(L.dense(h.astype(np.float64), W64, None), h.astype(np.float64) @ W64.widen(),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", list(P.FORMATS))
@pytest.mark.parametrize("M", [4, 70])
def test_matrices_joined_in_one_product_give_each_ones_numbers_to_the_bit(fmt, M):
    """A layer's queries, keys and values as one product: the parts' outputs side by side, each part's
    bits those of its own product (sizes that split the tasks of sixteen outputs across parts); SwiGLU
    gated: ``silu(gate) * up``, the bits of the tuned pass's separate steps; too few rows: None."""
    from core.model.tuned import forward as TF

    K = 64
    parts = [(random_rows(fmt, n, K, seed=n), np.random.default_rng(n).permutation(n)) for n in (23, 9, 30)]
    x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
    y = P.joined_product_if_loaded(x, parts, fmt)
    assert y.shape == (M, 62)
    np.testing.assert_array_equal(y, np.concatenate([P.rows_product(x, raw, order, fmt) for raw, order in parts], axis=1))
    gate, up = parts[0], (random_rows(fmt, 23, K, seed=5), np.arange(23))
    gated = P.joined_product_if_loaded(x, [gate, up], fmt, gated=True)
    np.testing.assert_array_equal(gated, TF.silu(P.rows_product(x, *gate, fmt)) * P.rows_product(x, *up, fmt))
    assert P.joined_product_if_loaded(x[:P.FEW_ROWS - 1], parts, fmt) is None


def test_a_layer_joins_compact_weights_of_one_format_and_width_only():
    K = 64
    W = [MATRICES["Q4_1"](random_rows("Q4_1", n, K, seed=n), transposed=True) for n in (32, 16, 16)]
    x = np.random.default_rng(0).standard_normal((2, 5, K)).astype(np.float32)
    y = L.dense_joined(x, W)
    assert y.shape == (2, 5, 64)
    np.testing.assert_array_equal(y, np.concatenate([L.dense(x, w, None) for w in W], axis=-1))
    other = MATRICES["Q8_0"](random_rows("Q8_0", 16, K, seed=3), transposed=True)
    assert L.dense_joined(x, (W[0], W[1], other)) is None                          # another format
    assert L.dense_joined(x, (W[0].widen(), W[1])) is None                         # a float array
