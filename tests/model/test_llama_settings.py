"""The Llama family's settings of the one transformer, by their own definitions: grouped-query
attention (a model whose key/value heads are repeated for each query head that reads them),
rotary positions (each pair of features turned by its angle; scores that see only distances),
the gated feed-forward network (its formula), their checks, parameters and cache entries, the KV
cache and generation through it, and head edits per query head."""
import numpy as np
import pytest

from core.model import config as C
from core.model import generation
from core.model import positions as POS
from core.model import transformer as tr

LLAMA = dict(vocab_size=19, n_ctx=16, d_model=24, n_heads=6, d_ff=20, n_layers=2, norm="rmsnorm",
             norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary", rope_base=100.0,
             tied_unembed=True, final_ln=True, bias=False, n_kv_heads=2)
IDS = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2]])


def llama(dtype=np.float64, seed: int = 0, **changes):
    """A tiny Llama-style model with every parameter random (norm gains near 1)."""
    cfg = C.TransformerConfig(**{**LLAMA, **changes})
    rng = np.random.default_rng(seed)
    params = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)
              for n, v in C.init_params(cfg, seed, np.float64).items()}
    return cfg, params


# ----------------------------------------------------------------------------------------------
# settings, checks, parameters
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, words", [
    (dict(n_kv_heads=4), "divides n_heads"), (dict(n_kv_heads=0), "divides n_heads"),
    (dict(n_kv_heads=2.0), "divides n_heads"), (dict(n_kv_heads=True), "divides n_heads"),
    (dict(d_ff=0), "gated_ffn"), (dict(gated_ffn="yes"), "gated_ffn"),
    (dict(d_model=30, n_heads=6, n_kv_heads=None), "d_k .* must be even"),
    (dict(rope_base=1.0), "rope_base"), (dict(rope_base=float("inf")), "rope_base"),
    (dict(rope_base="1e4"), "rope_base"),
])
def test_bad_llama_settings_are_refused_in_plain_words(bad, words):
    with pytest.raises(ValueError, match=words):
        C.TransformerConfig(**{**LLAMA, **bad})


def test_an_odd_head_width_is_fine_without_rotary_positions():
    C.TransformerConfig(**{**LLAMA, "d_model": 30, "n_kv_heads": None, "positional": "learned"})


def test_parameters_have_the_shared_vocabularys_shapes():
    cfg = C.TransformerConfig(**LLAMA)
    assert (cfg.kv_heads, cfg.group, cfg.d_k) == (2, 3, 4)
    shapes = C.param_shapes(cfg)
    assert shapes["blocks.1.attn.W_Q"] == shapes["blocks.1.attn.W_O"] == (24, 24)
    assert shapes["blocks.1.attn.W_K"] == shapes["blocks.1.attn.W_V"] == (24, 8)          # 2 heads of 4
    assert shapes["blocks.1.ffn.W_gate"] == shapes["blocks.1.ffn.W_1"] == (24, 20)
    assert shapes["blocks.1.ffn.W_2"] == (20, 24)
    assert shapes["blocks.1.ln1.g"] == shapes["ln_final.g"] == (24,)
    assert not any(n.split(".")[-1].startswith("b") or n in ("pos", "unembed") for n in shapes)
    biased = C.param_shapes(C.TransformerConfig(**{**LLAMA, "bias": True}))
    assert biased["blocks.0.attn.b_K"] == biased["blocks.0.attn.b_V"] == (8,) and biased["blocks.0.ffn.b_gate"] == (20,)
    assert C.TransformerConfig(**{**LLAMA, "n_kv_heads": None}).kv_heads == 6


# ----------------------------------------------------------------------------------------------
# grouped-query attention
# ----------------------------------------------------------------------------------------------
def repeated_kv_heads(params: dict, cfg: C.TransformerConfig) -> dict:
    """The same model with one key/value head per query head: key/value head g's columns written
    once for each query head that reads it (query head h reads g = h // group)."""
    out = dict(params)
    for name in params:
        if name.endswith(("attn.W_K", "attn.W_V", "attn.b_K", "attn.b_V")):
            heads = np.split(params[name], cfg.kv_heads, axis=-1)
            out[name] = np.concatenate([heads[h // cfg.group] for h in range(cfg.n_heads)], axis=-1)
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_query_attention_is_attention_with_each_key_value_head_repeated(bias):
    cfg, params = llama(bias=bias)
    full_cfg = C.TransformerConfig(**{**LLAMA, "bias": bias, "n_kv_heads": None})
    logits, cache = tr.forward(params, cfg, IDS)
    full_logits, full_cache = tr.forward(repeated_kv_heads(params, cfg), full_cfg, IDS)
    np.testing.assert_allclose(logits, full_logits, rtol=1e-12, atol=1e-12)
    for i in range(cfg.n_layers):
        np.testing.assert_allclose(cache[f"blocks.{i}.attn.weights"], full_cache[f"blocks.{i}.attn.weights"],
                                   rtol=1e-12, atol=1e-14)
        assert cache[f"blocks.{i}.attn.k"].shape == cache[f"blocks.{i}.attn.v"].shape == (2, 2, 9, 4)
        assert cache[f"blocks.{i}.attn.q"].shape == cache[f"blocks.{i}.attn.head_outputs"].shape == (2, 6, 9, 4)


def test_head_edits_act_per_query_head():
    """Zeroing query head 1 leaves heads 0 and 2, which read the same key/value head, as they were."""
    cfg, params = llama()
    _, cache = tr.forward(params, cfg, IDS)
    _, edited = tr.forward(params, cfg, IDS, ablate={(1, 1): "zero"})
    Z, Z_edited = cache["blocks.1.attn.head_outputs"], edited["blocks.1.attn.head_outputs"]
    assert np.all(Z_edited[:, 1] == 0) and np.abs(Z[:, 1]).max() > 0.1
    np.testing.assert_array_equal(Z_edited[:, [0, 2, 3, 4, 5]], Z[:, [0, 2, 3, 4, 5]])
    patched, _ = tr.forward(params, cfg, IDS, ablate={(1, 4): Z[:, 4]})     # a head patched with itself
    np.testing.assert_allclose(patched, tr.forward(params, cfg, IDS)[0], rtol=1e-13, atol=1e-13)


# ----------------------------------------------------------------------------------------------
# rotary positions
# ----------------------------------------------------------------------------------------------
def test_rotation_turns_each_pair_by_position_times_its_frequency():
    """Feature i and feature i + d_k/2 of position p, as one 2-D vector, turned by p base^(-2i/d_k)."""
    d_k, base, start, T = 8, 50.0, 3, 4
    x = np.random.default_rng(0).normal(size=(1, 2, T, d_k))
    cos, sin = POS.rotary_angles(start, T, d_k, base, np.float64)
    turned = POS.rotate(x, cos, sin)
    for t in range(T):
        for i in range(d_k // 2):
            a = (start + t) * base ** (-2 * i / d_k)
            R = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
            np.testing.assert_allclose(turned[..., t, [i, i + d_k // 2]], x[..., t, [i, i + d_k // 2]] @ R.T,
                                       rtol=1e-13, atol=1e-13)
    # its backward is the transposed rotation: <rotate(x), y> = <x, rotate_backward(y)>
    y = np.random.default_rng(1).normal(size=x.shape)
    assert np.sum(turned * y) == pytest.approx(np.sum(x * POS.rotate_backward(y, cos, sin)), rel=1e-13)


def test_rotary_scores_see_only_the_distance_between_query_and_key():
    """One token at every position, so that only positions tell them apart: a query and a key the same
    distance apart score the same wherever they sit (each diagonal of the scores is one number per
    head), and the embeddings get no positions at all."""
    cfg, params = llama(n_layers=1)
    ids = np.array([[5, 5, 5, 5, 5, 5, 5, 5, 5, 5]])                  # one token everywhere: only positions differ
    _, cache = tr.forward(params, cfg, ids)
    S = cache["blocks.0.attn.scores"][0]                                # (H, T, T), -inf above the diagonal
    np.testing.assert_array_equal(cache["pos_embed"], 0.0)
    for offset in range(4):                                              # each diagonal is one number per head
        diagonal = np.diagonal(S, -offset, axis1=1, axis2=2)
        np.testing.assert_allclose(diagonal, diagonal[:, :1] * np.ones_like(diagonal), rtol=1e-12, atol=1e-12)
    step = np.diagonal(S, 0, axis1=1, axis2=2)[:, 0] - np.diagonal(S, -1, axis1=1, axis2=2)[:, 0]
    assert np.abs(step).max() > 1e-3                                   # and the distance does count
    q, k = cache["blocks.0.attn.q_unrotated"], cache["blocks.0.attn.k_unrotated"]
    assert q.shape == (1, 6, 10, 4) and k.shape == (1, 2, 10, 4)
    np.testing.assert_allclose(cache["blocks.0.attn.q"][:, :, 0], q[:, :, 0], rtol=0, atol=0)   # position 0: no turn
    assert np.abs(cache["blocks.0.attn.q"][:, :, 1:] - q[:, :, 1:]).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# the gated feed-forward network, the KV cache, generation
# ----------------------------------------------------------------------------------------------
def test_the_gated_feed_forward_is_silu_of_the_gate_times_the_up_projection():
    cfg, params = llama(bias=True)
    _, cache = tr.forward(params, cfg, IDS)
    x, p = cache["blocks.1.ffn.input"], tr.block_params(params, "blocks.1.")
    gate = x @ p["ffn.W_gate"] + p["ffn.b_gate"]
    up = x @ p["ffn.W_1"] + p["ffn.b_1"]
    want = (gate / (1 + np.exp(-gate)) * up) @ p["ffn.W_2"] + p["ffn.b_2"]
    np.testing.assert_allclose(cache["blocks.1.ffn.output"], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cache["blocks.1.ffn.gate"], gate, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(cache["blocks.1.ffn.pre"], up, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(cache["blocks.1.ffn.hidden"], cache["blocks.1.ffn.gate_act"] * up,
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("tuned", [False, True], ids=["readable", "tuned"])
def test_the_kv_cache_gives_the_full_forward(tuned, monkeypatch):
    """The first 4 positions at once, then 2, then one at a time; with the tuned KV cache too."""
    monkeypatch.setattr(tr, "runs_tuned", lambda cfg, dtype: tuned)
    cfg, params = llama()
    full, _ = tr.forward(params, cfg, IDS)
    kv = [{} for _ in range(cfg.n_layers)]
    parts = [tr.forward(params, cfg, IDS[:, :4], kv=kv)[0], tr.forward(params, cfg, IDS[:, 4:6], kv=kv, start=4)[0]]
    parts += [tr.forward(params, cfg, IDS[:, t:t + 1], kv=kv, start=t)[0] for t in range(6, 9)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-12, atol=1e-12)
    assert kv[1]["K"].shape == (2, 2, 9, 4)                           # the 2 key/value heads, rotated and cached


def test_generation_through_the_kv_cache_gives_the_full_forwards_logits():
    cfg, params = llama()
    cached = generation.generate(params, cfg, prompt=IDS[0, :3], max_new_tokens=7, seed=4)
    full = generation.generate(params, cfg, prompt=IDS[0, :3], max_new_tokens=7, seed=4, use_cache=False)
    np.testing.assert_allclose(cached.step_logits, full.step_logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(cached.tokens, full.tokens)
    assert cached.keys.shape == (cfg.n_layers, 2, 9, 4)               # (L, H_kv, P + n - 1, d_k)
    assert len(cached.self_attn) == 7 and cached.self_attn[-1].shape == (cfg.n_layers, 6, 9)


def test_at_real_sizes_the_tuned_twins_run_and_agree_with_the_readable_steps(monkeypatch):
    """A Llama block 384 wide (BLAS's sizes) runs the tuned softmax and KV cache, and SiLU, which has
    no twin, as it is; its logits, through the KV cache, are the readable pass's to float32 rounding."""
    from core.model.tuned import forward as TF
    from core.recording import recording

    cfg, params = llama(np.float32, d_model=384, n_layers=1, d_ff=64, n_ctx=12)

    def run(tuned):
        monkeypatch.setattr(TF, "ready", lambda dtype: tuned)
        kv = [{}]
        with recording() as ran:
            first = tr.forward(params, cfg, IDS[:, :5], kv=kv)[0]
            rest = [tr.forward(params, cfg, IDS[:, t:t + 1], kv=kv, start=t)[0] for t in range(5, 9)]
        return np.concatenate([first] + rest, axis=1), set(ran.functions()), kv

    tuned, ran_tuned, kv = run(True)
    readable, ran_readable, _ = run(False)
    for twin in (TF.softmax_rows, TF.rms_norm, TF.rotate):
        assert twin in ran_tuned and twin not in ran_readable
    assert "buffer" in kv[0] and kv[0]["K"].shape == (2, 2, 9, 64)
    np.testing.assert_allclose(tuned, readable, rtol=1e-4, atol=1e-4 * np.abs(readable).max())
