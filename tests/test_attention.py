"""The public attention operations, on every backend, against the NumPy reference."""
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from core import attention as at
from core import masks
from core.kernels import dispatch
from core.kernels import gpu
from core.kernels import reference as ref
from core.kernels.tuned import cpu, simd, target

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [np.float32, np.float64]
TOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Tiny tiles and blocks, so several blocks and partial tiles run even at T=5, on both backends
    (a tuned CPU block of 5 queries runs one group of four and one left over)."""
    monkeypatch.setattr(gpu, "TILE", 3)
    monkeypatch.setattr(gpu, "THREADS", 4)
    monkeypatch.setattr(cpu, "QUERY_BLOCK", 5)
    monkeypatch.setattr(cpu, "KEY_TILE", 3)


@pytest.fixture(params=["cpu-lesson", "cpu-tuned", "cpu-tuned-parallel", "cpu-tuned-parallel-blocks", "cuda"])
def backend(request, monkeypatch):
    """Each kernel track the public operations dispatch to, whatever the size: the lesson CPU
    kernels, the tuned CPU kernels' serial builds and their prange builds (work units of whole
    heads where the heads share evenly among the threads; "blocks": units of a few queries
    always), and the lesson CUDA kernels (on Numba's simulator when there is no GPU)."""
    track = request.param
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 0 if "parallel" in track else 1 << 62)
    if track.endswith("blocks"):
        monkeypatch.setattr(cpu, "_query_block", lambda B, H, Tq, work: cpu.QUERY_BLOCK)
    with dispatch.track("tuned" if "tuned" in track else "lesson"), dispatch.recording() as ran:
        yield track.split("-")[0]
    expected = {"cpu-lesson": dispatch.LESSON_CPU, "cuda": dispatch.LESSON_GPU}.get(track, dispatch.TUNED_CPU)
    assert {call.module for call in ran} <= {expected}, "a call ran on another track than the one under test"


def close(actual, expected, dtype):
    np.testing.assert_allclose(actual, expected, rtol=TOL[dtype], atol=TOL[dtype])


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# (lead axes, Tq, Tk, d_k, d_v): T=1, T not a multiple of the tile, Tq != Tk, batched and not
SHAPES = [
    ((), 1, 1, 1, 1),
    ((), 5, 5, 3, 2),
    ((2,), 9, 3, 5, 5),
    ((2, 3), 5, 7, 2, 3),
    ((), 6, 37, 3, 20),   # keys and values over several SIMD vectors, with partial ones
]


def make_mask(kind, lead, Tq, Tk, dtype):
    if kind is None:
        return None
    if kind == "causal":
        return masks.causal(max(Tq, Tk), dtype)[:Tq, :Tk]
    if kind == "padding":   # per-sequence key lengths: several live keys per row, and in a batch
        B = lead[0] if lead else 1   # the first sequence empty (every row fully masked)
        lengths = [0 if b == 0 and B > 1 else Tk - 1 for b in range(B)]
        m = masks.padding(lengths, Tk, dtype)                      # (B, 1, Tk)
        return m.reshape((B,) + (1,) * (len(lead)) + (Tk,)) if lead else m[0]
    if kind == "full":      # arbitrary finite values, -inf holes and one fully masked row
        rng = np.random.default_rng(1)
        m = rng.standard_normal(lead + (Tq, Tk)).astype(dtype)
        m[rng.random(m.shape) < 0.3] = -np.inf
        m[..., 0, :] = -np.inf
        return m
    raise AssertionError(kind)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mask_kind", [None, "causal", "padding", "full"])
def test_attention_matches_reference(backend, dtype, shape, mask_kind):
    lead, Tq, Tk, dk, dv = shape
    rng = np.random.default_rng(0)
    Q, K, V = rand(rng, lead + (Tq, dk), dtype), rand(rng, lead + (Tk, dk), dtype), rand(rng, lead + (Tk, dv), dtype)
    mask = make_mask(mask_kind, lead, Tq, Tk, dtype)
    expected_out, expected_A = ref.attention(Q.astype(np.float64), K, V, mask)

    out, A = at.attention(Q, K, V, mask, backend=backend)
    fused, none = at.attention(Q, K, V, mask, backend=backend, return_weights=False)
    kept_out, kept_A, S = at.attention(Q, K, V, mask, backend=backend, return_scores=True)

    assert out.dtype == dtype and A.dtype == dtype and fused.dtype == dtype and S.dtype == dtype
    assert out.shape == lead + (Tq, dv) and A.shape == lead + (Tq, Tk) and none is None
    close(A, expected_A, dtype)
    close(out, expected_out, dtype)
    close(fused, expected_out, dtype)
    # the scores kept on the way: the reference's, masked (-inf where it is), and the same weights
    assert S.shape == lead + (Tq, Tk)
    close(S, ref.scaled_scores(Q.astype(np.float64), K, mask), dtype)
    np.testing.assert_array_equal(kept_A, A)
    np.testing.assert_array_equal(kept_out, out)
    # invariants: masked weights are exactly 0, each row sums to 1 (0 when nothing is allowed)
    allowed = np.ones(lead + (Tq, Tk), bool) if mask is None else np.broadcast_to(np.isfinite(mask), A.shape)
    assert np.all(A[~allowed] == 0.0)
    row_sums = A.sum(-1)
    close(row_sums, allowed.any(-1).astype(float), dtype)
    assert not np.isnan(out).any() and not np.isnan(fused).any()
    dead = ~allowed.any(-1)
    assert np.all(out[dead] == 0.0) and np.all(fused[dead] == 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", [None, "causal", "full"])
@pytest.mark.parametrize("parallel", [False, True])
def test_fused_key_tiles_that_start_inside_a_vector(monkeypatch, dtype, mask_kind, parallel):
    """Key tiles asked for as 21 keys (neither a multiple of a SIMD vector nor smaller than one),
    which the kernel rounds up to whole key panels, over 50 keys with 50 queries, so causal rows
    span one, two and more key tiles and the running max and sums are rescaled between tiles."""
    monkeypatch.setattr(cpu, "KEY_TILE", 21)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
    rng = np.random.default_rng(3)
    Q, K, V = rand(rng, (2, 50, 6), dtype), rand(rng, (2, 50, 6), dtype), rand(rng, (2, 50, 9), dtype)
    mask = make_mask(mask_kind, (2,), 50, 50, dtype)
    expected_out, _ = ref.attention(Q.astype(np.float64), K, V, mask)
    with dispatch.track("tuned"):                             # the tuned kernels, at this small size
        fused, _ = at.attention(Q, K, V, mask, backend="cpu", return_weights=False)
    close(fused, expected_out, dtype)


def test_work_units_follow_the_calling_threads_thread_count():
    """Whole heads per work unit when the heads share evenly among this thread's Numba threads,
    blocks of queries otherwise; read at each call (``numba.set_num_threads`` is per thread)."""
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert cpu._query_block(1, 3, 64, 1 << 30) == 64
        if numba.config.NUMBA_NUM_THREADS >= 2:
            numba.set_num_threads(2)
            assert cpu._query_block(1, 3, 64, 1 << 30) == cpu.QUERY_BLOCK
            assert cpu._query_block(1, 4, 64, 1 << 30) == 64
        assert cpu._query_block(1, 3, 64, cpu.PARALLEL_MIN_WORK - 1) == 64     # serial: one unit per head
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("tile_vectors", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 70, 3, 100), (9, 130, 20, 16), (5, 37, 3, 20)], ids=str)
@pytest.mark.parametrize("mask_kind", [None, "causal", "full"])
@pytest.mark.parametrize("parallel", [False, True])
def test_tuned_register_tiles_of_either_width(monkeypatch, tile_vectors, dtype, shape, mask_kind, parallel):
    """The 4 x 4 register tile (AVX-512's) and the 4 x 2 one (AVX2's): the key layout picks the
    tile, so both run in a build for AVX-512 whatever the machine. A build for 16 registers has no
    4 x 4 tile (tiles.WIDE_TILES): there keys in panels four vectors wide must go through the 4 x 2
    one, two vectors at a time. The shapes give whole panels of either width, two-vector and
    one-vector remainders of keys and of value features, and a value row narrower than a wide tile."""
    monkeypatch.setattr(target, "TILE_VECTORS", tile_vectors)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
    monkeypatch.setattr(cpu, "KEY_TILE", 64)                  # several key tiles at 70 and 130 keys
    Tq, Tk, dk, dv = shape
    rng = np.random.default_rng(4)
    Q, K, V = rand(rng, (2, Tq, dk), dtype), rand(rng, (2, Tk, dk), dtype), rand(rng, (2, Tk, dv), dtype)
    mask = make_mask(mask_kind, (2,), Tq, Tk, dtype)
    expected_out, expected_A = ref.attention(Q.astype(np.float64), K, V, mask)
    with dispatch.track("tuned"), dispatch.recording() as ran:
        out, A = at.attention(Q, K, V, mask, backend="cpu")
        fused, _ = at.attention(Q, K, V, mask, backend="cpu", return_weights=False)
        scores = at.scores(Q, K, mask, backend="cpu")
        kept_out, kept_A, kept = at.attention(Q, K, V, mask, backend="cpu", return_scores=True)
    summed = cpu.weighted_sum(expected_A.astype(dtype)[None], V[None])[0]   # A V alone, as the filter bank runs it
    assert {call.module for call in ran} == {dispatch.TUNED_CPU}
    assert cpu._panel(dtype) == tile_vectors * simd.lanes(np.dtype(dtype))
    for got, want in ((A, expected_A), (out, expected_out), (fused, expected_out), (summed, expected_out),
                      (scores, ref.scaled_scores(Q.astype(np.float64), K, mask)), (kept, scores)):
        close(got, want, dtype)
    np.testing.assert_array_equal(kept_A, A)
    np.testing.assert_array_equal(kept_out, out)


def test_fully_masked_case_really_occurs():
    """Guard: the 'full' and 'padding' masks above do produce rows with nothing allowed."""
    assert not np.isfinite(make_mask("full", (2,), 3, 4, np.float64)[..., 0, :]).any()
    assert not np.isfinite(make_mask("padding", (2,), 3, 4, np.float64)[0]).any()


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[2] >= 3], ids=str)
def test_padding_rows_leave_several_keys_live(shape):
    """Guard: rows of the padding mask above that allow anything allow at least two keys, so their
    weights depend on the scores (one allowed key would get weight 1 whatever the scale)."""
    lead, Tq, Tk = shape[:3]
    live = np.isfinite(np.broadcast_to(make_mask("padding", lead, Tq, Tk, np.float64), lead + (Tq, Tk)))
    counts = live.sum(-1)
    assert counts.max() >= 2 and not np.any(counts == 1)


def test_causal_rows_span_several_key_tiles():
    """Guard for the fused test above: with tiles of 21 keys, causal rows reach into the third tile."""
    live = np.isfinite(make_mask("causal", (2,), 50, 50, np.float64))
    last_live_key = np.array([np.flatnonzero(row).max() for row in live])
    assert set(last_live_key // 21) == {0, 1, 2}


@pytest.mark.parametrize("dtype", DTYPES)
def test_scores_match_reference(backend, dtype):
    rng = np.random.default_rng(2)
    Q, K = rand(rng, (2, 5, 3), dtype), rand(rng, (2, 6, 3), dtype)
    mask = masks.causal(6, dtype)[:5]
    close(at.scores(Q, K, mask, scale=0.7, backend=backend), ref.scaled_scores(Q, K, mask, 0.7), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "causal", "padding"])
def test_multi_head_attention_matches_reference(backend, dtype, batched, cross, mask_kind):
    rng = np.random.default_rng(3)
    B, Tq, Tk, d, H = 2, 5, (3 if cross else 5), 6, 3
    lead = (B,) if batched else ()
    X = rand(rng, lead + (Tq, d), dtype)
    X_kv = rand(rng, lead + (Tk, d), dtype) if cross else None
    W = [rand(rng, (d, d), dtype) * 0.5 for _ in range(4)]
    b = [rand(rng, (d,), dtype) for _ in range(4)]
    if mask_kind == "causal":
        mask = masks.causal(max(Tq, Tk), dtype)[:Tq, :Tk]
    elif mask_kind == "padding":
        mask = masks.padding([Tk, 1] if batched else [2], Tk, dtype)    # (B, 1, Tk)
        mask = mask if batched else mask[0]
    else:
        mask = None
    got = at.multi_head_attention(X, *W, H, mask, b_Q=b[0], b_K=b[1], b_V=b[2], b_O=b[3],
                                  X_kv=X_kv, backend=backend)
    want = ref.multi_head_attention(X, *W, H, mask, b_Q=b[0], b_K=b[1], b_V=b[2], b_O=b[3], X_kv=X_kv)
    for field in ("weights", "head_outputs", "concat", "output"):
        assert getattr(got, field).dtype == dtype
        close(getattr(got, field), want[field], dtype)
    assert got.weights.shape == lead + (H, Tq, Tk)
    assert got.output.shape == lead + (Tq, d)


@pytest.mark.parametrize("dtype", DTYPES)
def test_filter_bank_terms_match_reference_and_sum_to_output(backend, dtype):
    rng = np.random.default_rng(4)
    X = rand(rng, (5, 4), dtype)
    W_Q, W_K, W_V, W_O = (rand(rng, (4, 4), dtype) for _ in range(4))
    b_V = rand(rng, (4,), dtype)
    mha = at.multi_head_attention(X, W_Q, W_K, W_V, W_O, 2, masks.causal(5, dtype), b_V=b_V, backend=backend)
    terms = at.filter_bank(X, W_V, W_O, mha.weights, 2, b_V=b_V, backend=backend)
    assert terms.shape == (2, 5, 4)
    close(terms, ref.filter_bank(X, W_V, W_O, mha.weights, 2, b_V=b_V), dtype)
    close(terms.sum(axis=0), mha.concat @ W_O, dtype)


def test_split_and_merge_heads_follow_the_packed_column_convention():
    X = np.arange(2 * 3 * 6, dtype=float).reshape(2, 3, 6)        # (B, T, H*d) with H=3, d=2
    heads = at.split_heads(X, 3)
    assert heads.shape == (2, 3, 3, 2)
    for h in range(3):
        np.testing.assert_array_equal(heads[:, h], X[..., 2 * h:2 * h + 2])
    np.testing.assert_array_equal(at.merge_heads(heads), X)


@pytest.mark.parametrize("shape", [(4, 3, 2), (2, 4, 5, 3), (1, 1, 1)], ids=str)
def test_split_and_merge_heads_agree_with_the_reference(shape):
    """The product's reshapes are its own; the reference's are the oracle they must match."""
    O = np.random.default_rng(5).standard_normal(shape)            # (..., H, T, d)
    np.testing.assert_array_equal(at.merge_heads(O), ref.merge_heads(O))
    X = ref.merge_heads(O)                                          # (..., T, H*d)
    np.testing.assert_array_equal(at.split_heads(X, shape[-3]), ref.split_heads(X, shape[-3]))


def test_the_attention_module_does_not_import_the_reference():
    """Product code never uses the oracle: a check against it would compare it with itself."""
    code = "import sys, core.attention; sys.exit('core.kernels.reference' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or "core.attention imported core.kernels.reference"


# --- properties -------------------------------------------------------------------------------

finite = st.floats(-50, 50, allow_nan=False, width=64)


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 7), d=st.integers(1, 4), causal=st.booleans(), seed=st.integers(0, 2**16),
       gain=st.floats(0.01, 100))
def test_rows_sum_to_one_and_masked_weights_are_zero(T, d, causal, seed, gain):
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((2, T, d)) * gain for _ in range(3))
    mask = masks.causal(T) if causal else None
    _, A = at.attention(Q, K, V, mask, backend="cpu")
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-12)
    if causal:
        assert np.all(A[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 7), seed=st.integers(0, 2**16), data=st.data())
def test_permuting_tokens_without_positions_permutes_outputs(T, seed, data):
    perm = np.array(data.draw(st.permutations(range(T))))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, 4))
    W = [rng.standard_normal((4, 4)) for _ in range(4)]
    out = at.multi_head_attention(X, *W, 2, backend="cpu").output
    out_perm = at.multi_head_attention(X[perm], *W, 2, backend="cpu").output
    np.testing.assert_allclose(out_perm, out[perm], atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 6), H=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16), causal=st.booleans())
def test_filter_bank_identity_holds(T, H, seed, causal):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((T, 8))
    W_Q, W_K, W_V, W_O = (rng.standard_normal((8, 8)) for _ in range(4))
    mha = at.multi_head_attention(X, W_Q, W_K, W_V, W_O, H, masks.causal(T) if causal else None, backend="cpu")
    terms = at.filter_bank(X, W_V, W_O, mha.weights, H, backend="cpu")
    np.testing.assert_allclose(terms.sum(axis=0), mha.output, atol=1e-12)


# --- large values -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_huge_finite_scores_give_finite_weights_that_sum_to_one(backend, dtype):
    Q = np.array([[1e15], [-1e15], [1.0]], dtype)        # scores up to 1e30 (d_k = 1, scale 1)
    K = np.array([[1e15], [0.5], [-1e15]], dtype)
    V = np.arange(3, dtype=dtype).reshape(3, 1)
    for fused in (False, True):
        out, A = at.attention(Q, K, V, backend=backend, return_weights=not fused)
        assert np.isfinite(out).all()
        if A is not None:
            assert np.isfinite(A).all()
            np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-6)
            assert A[0, 0] == 1.0 and A[1, 2] == 1.0


def test_huge_mask_values_are_fine():
    out, A = at.attention(np.ones((2, 2)), np.ones((3, 2)), np.eye(3), np.array([0.0, -1e30, -1e300]))
    np.testing.assert_allclose(A, [[1, 0, 0], [1, 0, 0]])


# --- bad input: a ValueError that names the problem ------------------------------------------

GOOD = np.ones((3, 2))


@pytest.mark.parametrize("args, message", [
    ((np.ones((3, 2)), np.ones((3, 4)), GOOD), "same width d_k"),
    ((GOOD, np.ones((4, 2)), GOOD), "one row per key"),
    ((np.ones((2, 3, 2)), np.ones((3, 3, 2)), np.ones((3, 3, 2))), "batch/head axes"),
    ((np.full((3, 2), np.nan), GOOD, GOOD), "Q contains NaN"),
    ((GOOD, np.full((3, 2), np.inf), GOOD), "K contains an infinite value"),
    ((GOOD, GOOD, [[1, np.nan]] * 3), "V contains NaN"),
    ((GOOD, GOOD, [[1, -np.inf]] * 3), "V contains an infinite value"),
    ((np.ones((0, 2)), GOOD, GOOD), "Q is empty"),
    ((GOOD, np.ones((3, 0)), GOOD), "empty"),
    ((GOOD.astype(complex), GOOD, GOOD), "complex"),
    ((np.array([["a", "b"]] * 3), GOOD, GOOD), "must contain numbers"),
    ((np.ones(3), GOOD, GOOD), "dimensions"),
    ((np.full((3, 2), 1e200), np.full((3, 2), 1e200), GOOD), "too large"),
])
def test_attention_refuses_bad_input_with_a_clear_message(args, message):
    with pytest.raises(ValueError, match=message):
        at.attention(*args)


def test_the_scores_come_with_the_weights_only():
    """The fused kernel builds no (Tq, Tk) tensor, so it has no scores to give."""
    with pytest.raises(ValueError, match="return_scores=True needs return_weights=True"):
        at.attention(GOOD, GOOD, GOOD, return_weights=False, return_scores=True)


@pytest.mark.parametrize("T", [3, 64])
def test_queries_times_scale_must_fit_on_every_track(backend, T):
    """The tuned kernels scale the queries before the dot products: Q * scale beyond float32 is
    refused (even where tiny keys would keep the scores themselves small), the same way on every
    track and at every size."""
    Q = np.full((T, 2), 1e30, np.float32)
    K = np.full((T, 2), 1e-30, np.float32)
    with pytest.raises(ValueError, match="too large"):
        at.attention(Q, K, K, scale=1e10, backend=backend)
    out, A = at.attention(Q, K, K, scale=1e5, backend=backend)   # Q * scale = 1e35 fits
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-6)


def test_float32_overflow_is_refused_but_float64_is_fine():
    big = np.full((2, 2), 1e20, np.float32)
    with pytest.raises(ValueError, match="float32"):
        at.attention(big, big, big)
    out, A = at.attention(big.astype(np.float64), big.astype(np.float64), big.astype(np.float64))
    assert np.isfinite(out).all()


@pytest.mark.parametrize("mask, message", [
    (np.zeros((4, 4)), "does not broadcast"),
    (np.zeros((2, 1, 3, 3)), "does not broadcast"),
    (np.full((3, 3), np.nan), "not NaN"),
    (np.full((3, 3), np.inf), "not NaN or \\+inf"),
    (np.array([["a"] * 3] * 3), "must be numeric"),
])
def test_bad_masks_are_refused(mask, message):
    with pytest.raises(ValueError, match=message):
        at.attention(GOOD, GOOD, GOOD, mask)


def test_integers_are_converted_and_bool_masks_mean_may_attend():
    Q = np.array([[1, 0], [0, 1]])
    out, A = at.attention(Q, Q, Q, np.array([[True, False], [True, True]]))
    assert A.dtype == np.float64 and out.dtype == np.float64
    want_out, want_A = ref.attention(Q.astype(float), Q.astype(float), Q.astype(float), masks.causal(2))
    np.testing.assert_allclose(A, want_A, atol=1e-15)
    np.testing.assert_allclose(out, want_out, atol=1e-15)
    assert 0 < A[1, 0] < A[1, 1] < 1                   # query 2 weighs both keys: the values matter


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_heads=3), "cannot be split evenly into 3 heads"),
    (dict(n_heads=0), "positive whole number"),
    (dict(n_heads=2, X=np.full((3, 4), np.nan)), "X contains NaN"),
    (dict(n_heads=2, X=np.ones((0, 4))), "X is empty"),
    (dict(n_heads=2, W_Q=np.ones((5, 4))), "W_Q has 5 rows"),
    (dict(n_heads=2, W_O=np.ones((4, 4, 1))), "must be a matrix"),
    (dict(n_heads=2, b_Q=np.ones(3)), "b_Q must have shape"),
    (dict(n_heads=2, mask=np.zeros((2, 2))), "does not broadcast"),
    (dict(n_heads=2, X_kv=np.ones((2, 3, 4))), "same batch size"),
])
def test_multi_head_attention_refuses_bad_input(kwargs, message):
    args = dict(X=np.ones((3, 4)), W_Q=np.eye(4), W_K=np.eye(4), W_V=np.eye(4), W_O=np.eye(4))
    args.update(kwargs)
    n_heads = args.pop("n_heads")
    mask = args.pop("mask", None)
    X_kv = args.pop("X_kv", None)
    b_Q = args.pop("b_Q", None)
    with pytest.raises(ValueError, match=message):
        at.multi_head_attention(args["X"], args["W_Q"], args["W_K"], args["W_V"], args["W_O"], n_heads, mask,
                                b_Q=b_Q, X_kv=X_kv)


def test_masks_module():
    np.testing.assert_array_equal(masks.causal(3), ref.causal_mask(3))
    np.testing.assert_array_equal(masks.padding([2, 0], 3), ref.padding_mask([2, 0], 3))
    with pytest.raises(ValueError, match="at least 1"):
        masks.causal(0)
    with pytest.raises(ValueError, match="between 0 and T"):
        masks.padding([4], 3)
    with pytest.raises(ValueError, match="whole numbers"):
        masks.padding([1.5], 3)
