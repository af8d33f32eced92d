"""The one causal mask (core.masks.causal), with and without a KV cache's offset, against its formula;
and the compiled training step's attention, which applies causality as an index bound, against it."""
import numpy as np
import pytest

from core import masks
from core.kernels.tuned import simd
from core.model.tuned.attention import attention_forward


@pytest.mark.parametrize("start", [0, 1, 3, 7])
@pytest.mark.parametrize("T", [1, 2, 5, 9])
def test_query_i_at_position_start_plus_i_sees_the_keys_up_to_it(T, start):
    M = masks.causal(T, np.float32, start=start)
    i, j = np.indices((T, start + T))
    np.testing.assert_array_equal(M, np.where(j <= start + i, 0.0, -np.inf).astype(np.float32))
    assert M.dtype == np.float32
    # a KV cache's new rows are the last rows of the whole sequence's mask
    np.testing.assert_array_equal(M, masks.causal(start + T, np.float32)[start:])


def test_a_bad_length_or_offset_is_refused():
    for bad in (dict(T=0), dict(T=2, start=-1), dict(T=2, start=1.5)):
        with pytest.raises(ValueError):
            masks.causal(**bad)


@pytest.mark.parametrize("T", range(1, 13))
def test_the_compiled_attention_lets_through_exactly_the_keys_the_mask_allows(T):
    """The compiled step runs whole sequences (start 0): each query's weights are positive on the
    keys masks.causal(T) allows and exactly 0 on the others, in every head and every lane."""
    d, H, lanes = 4, 2, simd.lanes(np.dtype(np.float32))
    qkv = np.random.default_rng(T).normal(0, 0.5, (3 * d, T * lanes)).astype(np.float32)   # [q; k; v], (3d, N)
    P = np.ones((H, 1, T, T, lanes), np.float32)               # what an earlier step left in the buffer
    ctx = np.empty((d, T * lanes), np.float32)
    attention_forward(qkv, 0, qkv, d, 2 * d, True, P, ctx)
    allowed = np.isfinite(masks.causal(T))                                  # (T, T)
    np.testing.assert_array_equal(P > 0, np.broadcast_to(allowed[None, None, :, :, None], P.shape))
    np.testing.assert_array_equal(P[..., ~allowed, :], 0.0)
