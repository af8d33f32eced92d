"""The encoder's forward cache and head ablation (core.models.encoder.forward_cache /
forward_ablated) against the compiled forward pass and a NumPy oracle, and the lesson's
summaries of them (core.lessons.inside)."""
import numpy as np
import pytest

from core.kernels import reference
from core.lessons import inside
from core.models import encoder, encoder_cache
from core.models.compiled import encoder_step as K
from core.models.compiled.sublayers import packed_qkv
from core.models.encoder import EncoderConfig

SMALL = dict(vocab_size=7, seq_len=6, d_model=8, n_heads=2, d_ff=12, n_layers=2, n_classes=3)


def _params(cfg, seed=1, dtype=np.float64):
    """Parameters with non-trivial biases and gains, so every path of the forward pass shows."""
    params = encoder.init_params(cfg, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for value in params.values():
        if value.ndim == 1:
            value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
    return params


def _tokens(cfg, B, seed=0):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, cfg.seq_len))


def _reference(params, tokens, cfg, scale=None, fill=None):
    """Plain NumPy, like the formulas; head h of layer i has its output replaced by
    ``s z + (1 - s) f`` before W_O. Returns (logits, {name: array}) with the cache's names."""
    B, T = tokens.shape
    pe = {"sinusoidal": lambda: reference.sinusoidal(T, cfg.d_model), "learned": lambda: params["pos"][:T],
          "none": lambda: np.zeros((T, cfg.d_model))}[cfg.positional]()
    h = params["embed"][tokens] + pe
    out, dk = {}, cfg.d_k

    def layer_norm(x, g, b, name):
        mu = x.mean(-1, keepdims=True)
        xhat = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + cfg.ln_eps)
        out.update({f"{name}_in": x, f"{name}_mean": mu[..., 0], f"{name}_xhat": xhat, f"{name}_out": xhat * g + b})
        return xhat * g + b

    for i in range(cfg.n_layers):
        p = {k.split(".")[-1]: v for k, v in params.items() if k.startswith(f"layers.{i}.")}
        mha = reference.multi_head_attention(h, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], cfg.n_heads,
                                             b_Q=p["b_Q"], b_K=p["b_K"], b_V=p["b_V"])
        z = mha["head_outputs"].copy()                                              # (B, H, T, dk)
        for head in range(cfg.n_heads):
            s = 1.0 if scale is None else scale[i, head]
            f = 0.0 if fill is None else fill[i][:, head * dk:(head + 1) * dk]
            z[:, head] = s * z[:, head] + (1 - s) * f
        concat = z.transpose(0, 2, 1, 3).reshape(B, T, cfg.d_model)
        attn_out = concat @ p["W_O"] + p["b_O"]
        out.update({"resid_pre": h, "weights": mha["weights"], "concat": concat, "attn_out": attn_out})
        h1 = layer_norm(h + attn_out, p["ln1_g"], p["ln1_b"], "ln1")
        pre = h1 @ p["W_1"] + p["b_1"]
        ffn_out = np.maximum(pre, 0.0) @ p["W_2"] + p["b_2"]
        out.update({"ffn_pre": pre, "ffn_hidden": np.maximum(pre, 0.0), "ffn_out": ffn_out})
        h = layer_norm(h1 + ffn_out, p["ln2_g"], p["ln2_b"], "ln2")
        out = {(k if k.startswith("layers.") else f"layers.{i}.{k}"): v for k, v in out.items()}
    return h.mean(axis=1) @ params["W_cls"] + params["b_cls"], out


# ----------------------------------------------------------------------------------------------
# the forward cache is the compiled forward pass
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cache_equals_the_compiled_forward_bit_for_bit(dtype, positional):
    cfg = EncoderConfig(**SMALL, positional=positional)
    params, tokens = _params(cfg, dtype=dtype), _tokens(cfg, 37)          # three chunks, the last padded
    want, plain = encoder.forward(params, tokens, cfg)
    logits, cache = encoder.forward_cache(params, tokens, cfg)
    assert logits.dtype == dtype
    np.testing.assert_array_equal(logits, want)
    np.testing.assert_array_equal(cache["logits"], want)
    for name in ("attn", "hidden", "pooled"):
        np.testing.assert_array_equal(cache[name], plain[name])


def test_steps_write_what_forward_chunk_keeps():
    """The stepwise chunk forward fills the kernels' activations exactly as their own
    ``forward_chunk`` does, on the same chunk."""
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 5)
    flat, lay = encoder.flatten(params, cfg), encoder.layout(cfg)
    pe = encoder._pe_for(flat, cfg, cfg.seq_len)
    Wqkv, bqkv = packed_qkv(flat, lay)
    chunk = K.padded_chunk(tokens, 0, 5, flat)
    want = K.new_activations(lay, cfg.seq_len, chunk.shape[0], flat)
    got = K.new_activations(lay, cfg.seq_len, chunk.shape[0], flat)
    K.forward_chunk(flat, lay, Wqkv, bqkv, chunk, pe, cfg.ln_eps, want)
    encoder_cache._chunk_steps(flat, cfg, Wqkv, bqkv, chunk, pe, got, np.ones((2, 2)), None)
    for name in K.Activations._fields:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_cache_entries_match_the_numpy_oracle():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 20)
    logits, cache = encoder.forward_cache(params, tokens, cfg)
    want_logits, want = _reference(params, tokens, cfg)
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-12)
    for name, value in want.items():
        np.testing.assert_allclose(cache[name], value, rtol=0, atol=1e-12, err_msg=name)
    assert set(f"layers.0.{n}" for n in encoder.CACHE_LAYER_ENTRIES) <= set(cache)
    np.testing.assert_array_equal(cache["layers.1.resid_pre"], cache["layers.0.ln2_out"])
    np.testing.assert_array_equal(cache["layers.0.ffn_hidden"], np.maximum(cache["layers.0.ffn_pre"], 0))
    np.testing.assert_array_equal(cache["tok_embed"] + cache["pos_embed"], cache["layers.0.resid_pre"])


def test_layernorm_statistics_are_the_kernels():
    cfg = EncoderConfig(**SMALL)
    _, cache = encoder.forward_cache(_params(cfg), _tokens(cfg, 9), cfg)
    for i in range(cfg.n_layers):
        for ln in ("ln1", "ln2"):
            x, m, r = (cache[f"layers.{i}.{ln}_{s}"] for s in ("in", "mean", "rstd"))
            # the cached mean and 1/std reproduce the kernel's normalised sum exactly
            np.testing.assert_array_equal((x - m[..., None]) * r[..., None], cache[f"layers.{i}.{ln}_xhat"])
            var = x.var(axis=-1)
            np.testing.assert_allclose(cache[f"layers.{i}.{ln}_xhat"].std(axis=-1),
                                       np.sqrt(var / (var + cfg.ln_eps)), rtol=0, atol=1e-12)


def test_normalised_tokens_have_mean_0_and_std_1():
    cfg = EncoderConfig(**SMALL, ln_eps=1e-12)        # eps shrinks the std by sqrt(var / (var + eps))
    _, cache = encoder.forward_cache(_params(cfg), _tokens(cfg, 9), cfg)
    for i in range(cfg.n_layers):
        for ln in ("ln1", "ln2"):
            xhat = cache[f"layers.{i}.{ln}_xhat"]
            np.testing.assert_allclose(xhat.mean(axis=-1), 0.0, atol=1e-6)
            np.testing.assert_allclose(xhat.std(axis=-1), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# head ablation
# ----------------------------------------------------------------------------------------------
def test_ablating_no_head_reproduces_the_model_exactly():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 33)
    want, _ = encoder.forward(params, tokens, cfg)
    np.testing.assert_array_equal(encoder.forward_ablated(params, tokens, cfg, np.ones((2, 2))), want)
    labels = np.argmax(want, axis=1)
    assert inside.ablated_accuracy(params, cfg, tokens, labels, []) == 1.0


@pytest.mark.parametrize("layer", [0, 1])
def test_ablating_every_head_of_a_layer_zeroes_its_heads(layer):
    """All heads of a layer removed: the attention sublayer adds only b_O (the oracle with that
    layer's head outputs set to zero)."""
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 19)
    scale = inside.head_scale_for([(layer, 0), (layer, 1)], cfg)
    logits, cache = encoder.forward_cache(params, tokens, cfg, head_scale=scale)
    want_logits, want = _reference(params, tokens, cfg, scale)
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(cache[f"layers.{layer}.concat"], 0.0)
    np.testing.assert_allclose(cache[f"layers.{layer}.attn_out"],
                               np.broadcast_to(params[f"layers.{layer}.b_O"], (19, cfg.seq_len, cfg.d_model)),
                               rtol=0, atol=1e-15)
    np.testing.assert_array_equal(encoder.forward_ablated(params, tokens, cfg, scale), logits)
    assert not np.allclose(logits, encoder.forward(params, tokens, cfg)[0])


def test_one_head_zeroed_or_replaced_by_its_mean_matches_the_oracle():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 21)
    fill = np.random.default_rng(3).standard_normal((2, cfg.seq_len, cfg.d_model))
    for scale in (inside.head_scale_for([(1, 0)], cfg), np.array([[1.0, 0.5], [0.0, 1.0]])):
        for f in (None, fill):
            got = encoder.forward_ablated(params, tokens, cfg, scale, f)
            np.testing.assert_allclose(got, _reference(params, tokens, cfg, scale, f)[0], rtol=0, atol=1e-12)


def test_ablation_inputs_are_checked():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 3)
    with pytest.raises(ValueError, match="head_scale"):
        encoder.forward_ablated(params, tokens, cfg, np.ones((2, 3)))
    with pytest.raises(ValueError, match="head_fill"):
        encoder.forward_ablated(params, tokens, cfg, np.ones((2, 2)), np.zeros((2, 2, cfg.d_model)))
    with pytest.raises(ValueError, match="head 3"):
        inside.head_scale_for([(0, 2)], cfg)
    with pytest.raises(ValueError, match="ablation"):
        inside.ablated_accuracy(params, cfg, tokens, np.zeros(3, int), [(0, 0)], "shuffle")


def test_head_report_scores_each_head_and_the_mean_fill():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 40)
    labels = np.random.default_rng(5).integers(0, 3, 40)
    report = inside.head_ablation(params, cfg, tokens, labels)
    logits, cache = encoder.forward_cache(params, tokens, cfg)
    assert report.baseline == inside.accuracy(logits, labels)
    np.testing.assert_allclose(report.mean_maps, cache["attn"].mean(axis=1), atol=1e-12)
    np.testing.assert_allclose(report.head_means[1], cache["layers.1.concat"].mean(axis=0), atol=1e-12)
    for mode, fill in (("zero", None), ("mean", report.head_means)):
        scale = inside.head_scale_for([(1, 1)], cfg)
        want = inside.accuracy(encoder.forward_ablated(params, tokens, cfg, scale, fill), labels)
        assert report.accuracy[mode][1, 1] == want
        assert report.change(mode)[1, 1] == want - report.baseline
    # mean ablation: the removed head's output is its data-set mean at every position
    _, ablated = encoder.forward_cache(params, tokens, cfg, head_scale=inside.head_scale_for([(0, 1)], cfg),
                                       head_fill=report.head_means)
    np.testing.assert_allclose(ablated["layers.0.head_outputs"][:, 1],
                               np.broadcast_to(report.head_means[0][:, 4:8], (40, cfg.seq_len, 4)), atol=1e-15)
    assert np.all((report.focus >= -1e-12) & (report.focus <= 1 + 1e-12))


# ----------------------------------------------------------------------------------------------
# the lesson's summaries
# ----------------------------------------------------------------------------------------------
def test_walkthrough_reads_every_number_from_the_cache():
    cfg = EncoderConfig(**SMALL)
    params = _params(cfg)
    _, cache = encoder.forward_cache(params, _tokens(cfg, 4), cfg)
    steps = inside.walkthrough(cache, params, cfg, layer=1, example=2)
    by = {s.name: s for s in steps}
    assert by["residual sum h + attention"].arrays["ln1_in"] is not None
    np.testing.assert_array_equal(by["residual sum h + attention"].arrays["ln1_in"], cache["layers.1.ln1_in"][2])
    np.testing.assert_array_equal(by["LayerNorm 2"].arrays["out"], cache["layers.1.ln2_out"][2])
    np.testing.assert_array_equal(by["logits pooled W_cls + b_cls"].arrays["logits"], cache["logits"][2])
    assert by["FFN hidden relu(x W_1 + b_1)"].shape == "(T, d_ff) = (6, 12)"
    assert by["attention weights"].shape == "(H, T, T) = (2, 6, 6)"
    table = inside.layernorm_table(by["LayerNorm 1"])
    np.testing.assert_array_equal(table["mean before"], cache["layers.1.ln1_mean"][2])
    np.testing.assert_allclose(table["mean of x-hat"], 0.0, atol=1e-12)
    off = inside.relu_off_fraction(by["FFN hidden relu(x W_1 + b_1)"].arrays["hidden"])
    np.testing.assert_array_equal(off, np.mean(cache["layers.1.ffn_pre"][2] <= 0, axis=-1))
    with pytest.raises(ValueError, match="layer 3"):
        inside.walkthrough(cache, params, cfg, layer=2)
    with pytest.raises(ValueError, match="example 4"):
        inside.walkthrough(cache, params, cfg, layer=0, example=4)


def test_mean_pooling_averages_the_single_position_readouts():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 30)
    logits, cache = encoder.forward(params, tokens, cfg)
    per_position = inside.position_logits(cache, params)
    assert per_position.shape == (30, cfg.seq_len, 3)
    np.testing.assert_allclose(per_position.mean(axis=1), logits, rtol=0, atol=1e-12)
    labels = np.argmax(per_position[:, 0], axis=1)
    mean_acc, single = inside.pooling_accuracy(cache, params, labels)
    assert single[0] == 1.0 and mean_acc == inside.accuracy(logits, labels)
    np.testing.assert_allclose(inside.head_averaged_attention(cache, 0, 3), cache["attn"][0, 3].mean(axis=0))


def test_default_model_is_deterministic_by_seed():
    a = inside.train_default("sum", 3, n_train=64, n_val=8, n_test=16, steps=4)
    b = inside.train_default("sum", 3, n_train=64, n_val=8, n_test=16, steps=4)
    c = inside.train_default("sum", 4, n_train=64, n_val=8, n_test=16, steps=4)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    assert not np.array_equal(a.params["embed"], c.params["embed"])
    assert a.cfg == b.cfg and a.cfg.n_layers == 2 and a.cfg.n_heads == 4
