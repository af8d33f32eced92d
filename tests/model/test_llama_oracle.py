"""The Llama family as settings of the one transformer (RMSNorm before each sublayer, SwiGLU, rotary
positions, grouped-query attention, tied embeddings, no biases), against transformers'
``LlamaForCausalLM`` with random weights at SmolLM2-135M's per-layer sizes: its logits and every
attention map, in float64 (transformers' float32 roundings made float64: llama_oracle_support) and in
float32, through a whole sequence and through the KV cache."""
import numpy as np
import pytest

from core.model import transformer as tr
from llama_oracle_support import SMOLLM2_LAYER, float64_llama, ours_from_llama, random_llama
from oracle_support import require

SAME_HEADS = dict(SMOLLM2_LAYER, num_key_value_heads=SMOLLM2_LAYER["num_attention_heads"])


def ids_for(settings: dict, B: int = 2, T: int = 13, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, settings["vocab_size"], size=(B, T))


def theirs(model, ids):
    """transformers' logits and attention maps (one per layer, (B, H, T, T)) as NumPy arrays."""
    torch = require("torch")
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_attentions=True)
    return out.logits.numpy(), [a.numpy() for a in out.attentions]


@pytest.fixture(scope="module")
def float64_pair():
    """transformers' SmolLM2-shaped Llama in float64 throughout, its outputs, and ours from its weights."""
    model = random_llama(SMOLLM2_LAYER, seed=1)
    ids = ids_for(SMOLLM2_LAYER)
    with float64_llama(model):
        logits, attentions = theirs(model, ids)
    return model, ids, logits, attentions


def assert_float64_close(ours, ref):
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(ref).max()))


def test_the_settings_read_off_transformers_config_are_smollm2s(float64_pair):
    cfg, params = ours_from_llama(float64_pair[0])
    assert (cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_k, cfg.d_ff, cfg.rope_base) == (576, 9, 3, 64, 1536, 1e5)
    assert params["blocks.0.attn.W_K"].shape == (576, 192) and params["blocks.0.ffn.W_gate"].shape == (576, 1536)
    assert "unembed" not in params


def test_float64_logits_and_every_attention_map_match_transformers_llama(float64_pair):
    model, ids, ref_logits, ref_attentions = float64_pair
    cfg, params = ours_from_llama(model, np.float64)
    logits, cache = tr.forward(params, cfg, ids)
    assert logits.dtype == np.float64 and logits.shape == ref_logits.shape
    assert_float64_close(logits, ref_logits)
    assert len(ref_attentions) == cfg.n_layers
    for i, ref in enumerate(ref_attentions):
        assert cache[f"blocks.{i}.attn.weights"].shape == ref.shape == (2, 9, 13, 13)
        assert_float64_close(cache[f"blocks.{i}.attn.weights"], ref)


def test_float64_through_the_kv_cache_matches_transformers_llama(float64_pair):
    """The prompt's first 6 positions at once, then one token at a time: each position's logits are
    transformers' for the whole sequence (the keys rotated at their own positions, then cached)."""
    model, ids, ref_logits, _ = float64_pair
    cfg, params = ours_from_llama(model, np.float64)
    kv = [{} for _ in range(cfg.n_layers)]
    parts = [tr.forward(params, cfg, ids[:, :6], kv=kv)[0]]
    parts += [tr.forward(params, cfg, ids[:, t:t + 1], kv=kv, start=t)[0] for t in range(6, ids.shape[1])]
    assert kv[0]["K"].shape == (2, 3, 13, 64)                       # the cache holds the 3 key/value heads only
    assert_float64_close(np.concatenate(parts, axis=1), ref_logits)


def test_float64_with_a_key_value_head_per_query_head_matches_transformers_llama():
    model = random_llama(SAME_HEADS, seed=2)
    ids = ids_for(SAME_HEADS, seed=2)
    with float64_llama(model):
        ref_logits, ref_attentions = theirs(model, ids)
    cfg, params = ours_from_llama(model, np.float64)
    assert cfg.kv_heads == cfg.n_heads == 9 and cfg.group == 1
    logits, cache = tr.forward(params, cfg, ids)
    assert_float64_close(logits, ref_logits)
    for i, ref in enumerate(ref_attentions):
        assert_float64_close(cache[f"blocks.{i}.attn.weights"], ref)


@pytest.fixture(scope="module")
def float32_pair():
    model = random_llama(SMOLLM2_LAYER, seed=3)
    ids = ids_for(SMOLLM2_LAYER, seed=3)
    return model, ids, *theirs(model, ids)


def assert_float32_close(ours, ref):
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_float32_matches_transformers_llama_as_it_runs(float32_pair):
    """transformers' own float32 model, its roundings unpatched."""
    model, ids, ref_logits, ref_attentions = float32_pair
    cfg, params = ours_from_llama(model, np.float32)
    logits, cache = tr.forward(params, cfg, ids)
    assert_float32_close(logits, ref_logits)
    for i, ref in enumerate(ref_attentions):
        assert_float32_close(cache[f"blocks.{i}.attn.weights"], ref)


def test_float32_through_the_kv_cache_matches_transformers_llama(float32_pair):
    model, ids, ref_logits, _ = float32_pair
    cfg, params = ours_from_llama(model, np.float32)
    kv = [{} for _ in range(cfg.n_layers)]
    parts = [tr.forward(params, cfg, ids[:, :4], kv=kv)[0]]
    parts += [tr.forward(params, cfg, ids[:, t:t + 1], kv=kv, start=t)[0] for t in range(4, ids.shape[1])]
    assert_float32_close(np.concatenate(parts, axis=1), ref_logits)
