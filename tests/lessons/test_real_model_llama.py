"""The real-model page's analyses on a Llama-family model (SmolLM2's architecture, small): grouped-query
attention's sizes, the logit lens through the model's own norm a slice of the vocabulary at a time,
head edits resumed at the edited layer, and compact weights counted and read."""
import dataclasses

import numpy as np
import pytest

from core.lessons import real_model as rm
from core.model import config as C
from core.model import transformer as tr
from core.model.compact import CompactMatrix

LLAMA = C.TransformerConfig(vocab_size=23, n_ctx=16, d_model=24, n_heads=6, n_kv_heads=2, d_ff=20, n_layers=3,
                            norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                            positional="rotary", rope_base=100.0, tied_unembed=True, final_ln=True, bias=False)
# SmolLM2-135M-Instruct's sizes, as its GGUF file gives them
SMOLLM2 = dataclasses.replace(LLAMA, vocab_size=49152, n_ctx=8192, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536,
                              n_layers=30, rope_base=100000.0, ln_eps=1e-5)
IDS = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])


def llama_params(cfg=LLAMA, seed=0, dtype=np.float64):
    return C.init_params(cfg, seed=seed, dtype=dtype)


class LoggedMatrix(CompactMatrix):
    """A float matrix posing as a compact one: each widening and each read of rows noted in ``log``."""

    def __init__(self, values, log):
        self.values, self.shape, self.dtype, self.log = values, values.shape, values.dtype, log

    @property
    def nbytes(self):
        return self.values.nbytes

    def widen(self):
        self.log.append(("widen", self.shape))
        return self.values

    def rows(self, ids):
        self.log.append(("rows", np.size(ids)))
        return self.values[ids]


# ----------------------------------------------------------------------------------------------
# grouped-query attention: which heads share, what it saves
# ----------------------------------------------------------------------------------------------
def test_smollm2s_grouped_attention_and_kv_cache_by_hand():
    sizes = rm.grouped_query(SMOLLM2)
    assert sizes.attention_params == 576 * 576 * 2 + 576 * 192 * 2 == 884_736
    assert sizes.full_attention_params == 4 * 576 ** 2 == 1_327_104
    assert sizes.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert sizes.full_kv_bytes_per_token == 2 * 30 * 9 * 64 * 4 == 138_240
    assert sizes.kv_bytes(8192) == (8192 * 46_080, 8192 * 138_240)
    assert rm.query_heads_of(SMOLLM2) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kv", [None, 1, 2, 3, 6])
def test_attention_params_are_the_arrays_the_config_builds(bias, kv):
    cfg = dataclasses.replace(LLAMA, n_kv_heads=kv, bias=bias)
    params = llama_params(cfg)
    built = sum(v.size for name, v in params.items() if name.startswith("blocks.0.attn."))
    sizes = rm.grouped_query(cfg)
    assert sizes.attention_params == built
    full = sum(v.size for name, v in llama_params(dataclasses.replace(cfg, n_kv_heads=None)).items()
               if name.startswith("blocks.0.attn."))
    assert sizes.full_attention_params == full


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kv", [1, 2, 6])
def test_kv_bytes_per_token_are_what_the_kv_cache_holds(dtype, kv):
    cfg = dataclasses.replace(LLAMA, n_kv_heads=kv)
    cache = [{} for _ in range(cfg.n_layers)]
    tr.forward(llama_params(cfg, dtype=dtype), cfg, IDS, kv=cache)
    held = sum(layer["K"].nbytes + layer["V"].nbytes for layer in cache)
    sizes = rm.grouped_query(cfg, itemsize=np.dtype(dtype).itemsize)
    assert held == len(IDS) * sizes.kv_bytes_per_token
    assert sizes.kv_bytes(len(IDS))[0] == held
    assert sizes.full_kv_bytes_per_token == sizes.kv_bytes_per_token * cfg.n_heads // kv


def test_the_heads_said_to_share_keys_and_values_are_those_the_model_groups():
    """Give every query head the same queries: heads that read one key/value head draw the same map,
    heads that read different ones different maps."""
    params = dict(llama_params(seed=4))
    d_k = LLAMA.d_k
    W_Q = params["blocks.0.attn.W_Q"].copy()
    for h in range(1, LLAMA.n_heads):
        W_Q[:, h * d_k:(h + 1) * d_k] = W_Q[:, :d_k]
    params["blocks.0.attn.W_Q"] = W_Q
    _, cache = tr.forward(params, LLAMA, IDS)
    A = cache["blocks.0.attn.weights"][0]                                  # (H, T, T)
    groups = rm.query_heads_of(LLAMA)
    assert sorted(h for g in groups for h in g) == list(range(LLAMA.n_heads))
    for g, heads in enumerate(groups):
        for h in heads:
            np.testing.assert_allclose(A[h], A[heads[0]], rtol=1e-12, atol=1e-15)
        for other in groups[g + 1:]:
            assert np.abs(A[heads[0]] - A[other[0]]).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# the logit lens: the model's own final norm, the vocabulary a slice at a time
# ----------------------------------------------------------------------------------------------
def lens_by_hand(params, cfg, cache):
    """Every residual stream through RMSNorm (g x / sqrt(mean x² + eps)) and the tied unembedding, the
    whole vocabulary at once: the best token and its probability."""
    streams = [cache[f"blocks.{l}.resid_pre"][0] for l in range(cfg.n_layers)]
    streams.append(cache[f"blocks.{cfg.n_layers - 1}.resid_post"][0])
    x = np.stack(streams)
    x = params["ln_final.g"] * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + cfg.ln_eps)
    z = x @ params["embed"].T
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p.argmax(axis=-1), p.max(axis=-1)


@pytest.mark.parametrize("slice_size", [1, 5, 23, 4096])
def test_the_logit_lens_reads_through_rmsnorm_a_slice_of_the_vocabulary_at_a_time(slice_size):
    params = llama_params(seed=1)
    logits, cache = tr.forward(params, LLAMA, IDS)
    top, prob = rm.logit_lens(params, LLAMA, cache, slice_size=slice_size)
    want_top, want_prob = lens_by_hand(params, LLAMA, cache)
    np.testing.assert_array_equal(top, want_top)
    np.testing.assert_allclose(prob, want_prob, rtol=1e-12)
    np.testing.assert_array_equal(top[-1], logits[0].argmax(-1))            # the last row: the model's own
    assert len(set(top.ravel())) > 3


def test_the_logit_lens_widens_no_whole_compact_embedding():
    params = llama_params(seed=2, dtype=np.float32)
    _, cache = tr.forward(params, LLAMA, IDS)
    log = []
    compact = {**params, "embed": LoggedMatrix(params["embed"], log)}
    top, prob = rm.logit_lens(compact, LLAMA, cache, slice_size=8)
    want_top, want_prob = rm.logit_lens(params, LLAMA, cache, slice_size=8)
    np.testing.assert_array_equal(top, want_top)
    np.testing.assert_allclose(prob, want_prob, rtol=1e-6)
    assert log == [("rows", 8), ("rows", 8), ("rows", 7)]                 # 23 tokens in slices, never widened


def test_an_untied_unembedding_and_its_bias_are_read_in_slices_too():
    cfg = dataclasses.replace(LLAMA, tied_unembed=False, unembed_b=True)
    params = dict(llama_params(cfg, seed=3))
    params["unembed_b"] = np.random.default_rng(0).normal(size=cfg.vocab_size)
    logits, cache = tr.forward(params, cfg, IDS)
    top, prob = rm.logit_lens(params, cfg, cache, slice_size=4)
    z = logits[0].astype(np.float64)
    np.testing.assert_array_equal(top[-1], z.argmax(-1))
    np.testing.assert_allclose(prob[-1], 1 / np.exp(z - z.max(-1, keepdims=True)).sum(-1), rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# head edits, resumed at the edited layer
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", [0, 1, 2])
@pytest.mark.parametrize("how", ["zero", "mean", "patch"])
def test_an_edit_resumed_at_its_layer_gives_the_whole_edited_pass(layer, how):
    params = llama_params(seed=5)
    logits, cache = tr.forward(params, LLAMA, IDS)
    _, other_cache = tr.forward(params, LLAMA, np.array([7, 7, 2, 11]))
    edit = rm.head_edit(cache, layer, 4, how, other_cache)
    whole, _ = tr.forward(params, LLAMA, IDS, ablate=edit)
    resumed = rm.resumed_logits(params, LLAMA, cache, layer, edit)
    np.testing.assert_allclose(resumed, whole[:, -1], rtol=1e-12, atol=1e-13)
    assert np.abs(whole[:, -1] - logits[:, -1]).max() > 1e-6                # the edit moves something
    fast, slow = (rm.edit_effect(params, LLAMA, IDS, logits, edit, cache=cache),
                  rm.edit_effect(params, LLAMA, IDS, logits, edit))
    assert [r["id"] for r in fast] == [r["id"] for r in slow]
    np.testing.assert_allclose([r["after"] for r in fast], [r["after"] for r in slow], rtol=1e-12)


def test_a_compact_models_parameters_are_counted_by_what_they_widen_to():
    params = llama_params(seed=6, dtype=np.float32)
    compact = {name: LoggedMatrix(v, []) if v.ndim == 2 else v for name, v in params.items()}
    assert rm.parameter_count(compact) == rm.parameter_count(params) == sum(v.size for v in params.values())
