"""The attention sublayer's head edits: zero and mean ablation and patching, alone and inside a
padded batch, where a sequence's result must not depend on the sequences padded beside it."""
import numpy as np
import pytest

from core.model import config as C
from core.model import multi_head as MH
from core.model import transformer as tr

PAD = -np.inf


def test_mean_ablation_averages_each_sequences_real_positions_by_hand():
    """Two sequences of one-number heads: the first has 3 tokens (1, 2, 6: mean 3), the second 2
    tokens (4, 8: mean 6) and a padding position holding 100, which must not count (all three
    positions would give 112/3)."""
    Z = np.zeros((2, 2, 3, 1))
    Z[0, 0, :, 0] = [1.0, 2.0, 6.0]
    Z[1, 0, :, 0] = [4.0, 8.0, 100.0]
    Z[:, 1, :, 0] = [[7.0, 8.0, 9.0], [-1.0, -2.0, -3.0]]                  # head 1: left alone
    mask = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, PAD]])[:, None, None, :]  # (B, 1, 1, T), additive

    mean = MH.edit_heads(Z, {(0, 0): "mean"}, 0, mask)
    np.testing.assert_array_equal(mean[:, 0, :, 0], [[3.0, 3.0, 3.0], [6.0, 6.0, 6.0]])
    np.testing.assert_array_equal(mean[:, 1], Z[:, 1])
    zero = MH.edit_heads(Z, {(0, 0): "zero"}, 0, mask)
    np.testing.assert_array_equal(zero[:, 0], 0.0)
    np.testing.assert_array_equal(zero[:, 1], Z[:, 1])
    assert Z[1, 0, 2, 0] == 100.0                                          # the input is not edited in place
    # another layer's edit leaves these outputs as they are
    assert MH.edit_heads(Z, {(1, 0): "mean"}, 0, mask) is Z
    # without a mask every position is real: the plain mean over all of them
    np.testing.assert_array_equal(MH.edit_heads(Z, {(0, 0): "mean"}, 0)[1, 0, :, 0], [112 / 3] * 3)
    with pytest.raises(ValueError, match="positions"):
        MH.edit_heads(Z, {(0, 0): "mean"}, 0, mask[..., :2])


def test_a_mask_with_no_padding_gives_the_plain_mean_exactly():
    Z = np.random.default_rng(0).normal(size=(2, 3, 5, 4))
    no_padding = np.zeros((2, 1, 1, 5))
    np.testing.assert_array_equal(MH.edit_heads(Z, {(0, 2): "mean"}, 0, no_padding),
                                  MH.edit_heads(Z, {(0, 2): "mean"}, 0))


ENCODER = C.TransformerConfig(vocab_size=17, n_ctx=12, d_model=12, n_heads=3, d_ff=20, n_layers=2, causal=False,
                              head="none", positional="learned")
DECODER = C.TransformerConfig(vocab_size=17, n_ctx=12, d_model=12, n_heads=3, d_ff=20, n_layers=2, norm_placement="pre",
                              activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)


@pytest.mark.parametrize("how", ["zero", "mean"])
@pytest.mark.parametrize("cfg", [ENCODER, DECODER], ids=["encoder", "causal"])
def test_a_padded_batchs_edited_heads_give_each_sequence_as_it_runs_alone(cfg, how):
    """Sequences of 5, 2 and 7 tokens padded into one batch with a key mask: with heads ablated in
    both layers, each sequence's outputs at its tokens are the ones it gets run alone."""
    params = C.init_params(cfg, seed=3, dtype=np.float64)
    rng = np.random.default_rng(1)
    sequences = [rng.integers(1, cfg.vocab_size, size=n) for n in (5, 2, 7)]
    T = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), T), dtype=np.int64)
    key_mask = np.zeros_like(ids)
    for b, s in enumerate(sequences):
        ids[b, :len(s)], key_mask[b, :len(s)] = s, 1
    ablate = {(0, 1): how, (1, 2): how}
    batch, cache = tr.forward(params, cfg, ids, key_mask=key_mask, ablate=ablate)
    for b, s in enumerate(sequences):
        alone, alone_cache = tr.forward(params, cfg, s[None], ablate=ablate)
        np.testing.assert_allclose(batch[b, :len(s)], alone[0], rtol=1e-12, atol=1e-12, err_msg=f"sequence {b}")
        for l in range(cfg.n_layers):
            name = f"blocks.{l}.attn.head_outputs"
            np.testing.assert_allclose(cache[name][b, :, :len(s)], alone_cache[name][0], rtol=1e-12, atol=1e-12,
                                       err_msg=f"sequence {b}, {name}")
    plain, _ = tr.forward(params, cfg, ids, key_mask=key_mask)
    assert np.abs(plain - batch).max() > 1e-3                              # the edit changes the outputs
