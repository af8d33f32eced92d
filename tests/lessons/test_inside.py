"""The encoder's forward cache and head ablation as "Inside a trained model" reads them
(core.lessons.inside: the encoder run as the one transformer) against a plain NumPy oracle, and the
lesson's summaries of them. That the compiled forward pass gives the same cache is
tests/training/test_steps.py's."""
import numpy as np
import pytest

from core.kernels import reference
from core.lessons import inside
from core.model.tuned import classifier
from core.model.tuned.classifier import EncoderConfig

SMALL = dict(vocab_size=7, seq_len=6, d_model=8, n_heads=2, d_ff=12, n_layers=2, n_classes=3)
LAYER_ENTRIES = ("resid_pre", "attn.weights", "attn.head_outputs", "attn.concat", "attn.output", "ln1.input",
                 "ln1.mean", "ln1.std", "ln1.normalized", "resid_mid", "ffn.pre", "ffn.hidden", "ffn.output",
                 "ln2.input", "ln2.mean", "ln2.std", "ln2.normalized", "resid_post")


def _params(cfg, seed=1, dtype=np.float64):
    """Parameters with non-trivial biases and gains, so every path of the forward pass shows."""
    params = classifier.init_params(cfg, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for value in params.values():
        if value.ndim == 1:
            value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
    return params


def _tokens(cfg, B, seed=0):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (B, cfg.n_ctx))


def _reference(params, tokens, cfg, heads=(), fill=None):
    """Plain NumPy, like the formulas, on the parameters' names; each ``(layer, head)``
    of ``heads`` has its output replaced, before W_O, by 0 or by ``fill[layer, head]`` (T, d_k).
    Returns (logits, {cache name: array})."""
    B, T = tokens.shape
    pe = {"sinusoidal": lambda: reference.sinusoidal(T, cfg.d_model), "learned": lambda: params["pos"][:T],
          "none": lambda: np.zeros((T, cfg.d_model))}[cfg.positional]()
    h = params["embed"][tokens] + pe
    out = {}

    def layer_norm(x, g, b, name):
        mu = x.mean(-1, keepdims=True)
        std = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + cfg.ln_eps)
        out.update({f"{name}.input": x, f"{name}.mean": mu[..., 0], f"{name}.std": std[..., 0],
                    f"{name}.normalized": (x - mu) / std})
        return (x - mu) / std * g + b

    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        p = {k.removeprefix(b): v for k, v in params.items() if k.startswith(b)}
        mha = reference.multi_head_attention(h, p["attn.W_Q"], p["attn.W_K"], p["attn.W_V"], p["attn.W_O"],
                                             cfg.n_heads, b_Q=p["attn.b_Q"], b_K=p["attn.b_K"], b_V=p["attn.b_V"])
        z = mha["head_outputs"].copy()                                              # (B, H, T, dk)
        for layer, head in heads:
            if layer == i:
                z[:, head] = 0.0 if fill is None else fill[layer, head]
        concat = z.transpose(0, 2, 1, 3).reshape(B, T, cfg.d_model)
        attn_out = concat @ p["attn.W_O"] + p["attn.b_O"]
        out.update({b + "resid_pre": h, b + "attn.weights": mha["weights"], b + "attn.head_outputs": z,
                    b + "attn.concat": concat, b + "attn.output": attn_out})
        out[b + "resid_mid"] = x = layer_norm(h + attn_out, p["ln1.g"], p["ln1.b"], b + "ln1")
        pre = x @ p["ffn.W_1"] + p["ffn.b_1"]
        ffn_out = np.maximum(pre, 0.0) @ p["ffn.W_2"] + p["ffn.b_2"]
        out.update({b + "ffn.pre": pre, b + "ffn.hidden": np.maximum(pre, 0.0), b + "ffn.output": ffn_out})
        out[b + "resid_post"] = h = layer_norm(x + ffn_out, p["ln2.g"], p["ln2.b"], b + "ln2")
    out["pooled"] = h.mean(axis=1)
    return out["pooled"] @ params["classifier.W"] + params["classifier.b"], out


# ----------------------------------------------------------------------------------------------
# the forward cache
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "none"])
def test_cache_entries_match_the_numpy_oracle(positional):
    cfg = EncoderConfig(**SMALL, positional=positional)
    params, tokens = _params(cfg), _tokens(cfg, 20)
    logits, cache = inside.forward(params, cfg, tokens)
    want_logits, want = _reference(params, tokens, cfg)
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-12)
    assert set(f"blocks.0.{n}" for n in LAYER_ENTRIES) <= set(want) <= set(cache)
    for name, value in want.items():
        np.testing.assert_allclose(cache[name], value, rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_array_equal(cache["blocks.1.resid_pre"], cache["blocks.0.resid_post"])
    np.testing.assert_array_equal(cache["token_embed"] + cache["pos_embed"], cache["blocks.0.resid_pre"])


def test_layernorm_statistics_reproduce_the_normalised_input():
    cfg = EncoderConfig(**SMALL)
    _, cache = inside.forward(_params(cfg), cfg, _tokens(cfg, 9))
    for i in range(cfg.n_layers):
        for ln in ("ln1", "ln2"):
            x, m, s = (cache[f"blocks.{i}.{ln}.{n}"] for n in ("input", "mean", "std"))
            xhat = cache[f"blocks.{i}.{ln}.normalized"]
            np.testing.assert_allclose((x - m[..., None]) / s[..., None], xhat, rtol=0, atol=1e-12)
            var = x.var(axis=-1)
            np.testing.assert_allclose(s, np.sqrt(var + cfg.ln_eps), rtol=1e-12)
            np.testing.assert_allclose(xhat.std(axis=-1), np.sqrt(var / (var + cfg.ln_eps)), rtol=0, atol=1e-12)


def test_normalised_tokens_have_mean_0_and_std_1():
    cfg = EncoderConfig(**SMALL, ln_eps=1e-12)        # eps shrinks the std by sqrt(var / (var + eps))
    _, cache = inside.forward(_params(cfg), cfg, _tokens(cfg, 9))
    for i in range(cfg.n_layers):
        for ln in ("ln1", "ln2"):
            xhat = cache[f"blocks.{i}.{ln}.normalized"]
            np.testing.assert_allclose(xhat.mean(axis=-1), 0.0, atol=1e-6)
            np.testing.assert_allclose(xhat.std(axis=-1), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# head ablation
# ----------------------------------------------------------------------------------------------
def test_ablating_no_head_reproduces_the_model_exactly():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 33)
    want, _ = inside.forward(params, cfg, tokens)
    np.testing.assert_array_equal(inside.ablated_logits(params, cfg, tokens, []), want)
    labels = np.argmax(want, axis=1)
    assert inside.ablated_accuracy(params, cfg, tokens, labels, []) == 1.0


@pytest.mark.parametrize("layer", [0, 1])
def test_ablating_every_head_of_a_layer_leaves_only_the_output_bias(layer):
    """All heads of a layer removed: the attention sublayer adds only b_O."""
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 19)
    heads = [(layer, 0), (layer, 1)]
    logits, cache = inside.forward(params, cfg, tokens, ablate={head: "zero" for head in heads})
    np.testing.assert_allclose(logits, _reference(params, tokens, cfg, heads)[0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(cache[f"blocks.{layer}.attn.concat"], 0.0)
    np.testing.assert_allclose(cache[f"blocks.{layer}.attn.output"],
                               np.broadcast_to(params[f"blocks.{layer}.attn.b_O"], (19, cfg.n_ctx, cfg.d_model)),
                               rtol=0, atol=1e-15)
    np.testing.assert_array_equal(inside.ablated_logits(params, cfg, tokens, heads), logits)
    assert not np.allclose(logits, inside.forward(params, cfg, tokens)[0])


def test_one_head_zeroed_or_replaced_by_its_mean_matches_the_oracle():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 21)
    means = np.random.default_rng(3).standard_normal((2, 2, cfg.n_ctx, cfg.d_k))
    for heads in ([(1, 0)], [(0, 1), (1, 1)]):
        for mode, fill in (("zero", None), ("mean", means)):
            got = inside.ablated_logits(params, cfg, tokens, heads, mode, means)
            np.testing.assert_allclose(got, _reference(params, tokens, cfg, heads, fill)[0], rtol=0, atol=1e-12)


def test_ablation_inputs_are_checked():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 3)
    with pytest.raises(ValueError, match="head 3"):
        inside.ablated_logits(params, cfg, tokens, [(0, 2)])
    with pytest.raises(ValueError, match="Layer 3"):
        inside.ablated_logits(params, cfg, tokens, [(2, 0)])
    with pytest.raises(ValueError, match="ablation"):
        inside.ablated_accuracy(params, cfg, tokens, np.zeros(3, int), [(0, 0)], "shuffle")
    with pytest.raises(ValueError, match="head_means"):
        inside.ablated_logits(params, cfg, tokens, [(0, 0)], "mean")


def test_head_report_scores_each_head_and_the_mean_fill():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 40)
    labels = np.random.default_rng(5).integers(0, 3, 40)
    report = inside.head_ablation(params, cfg, tokens, labels)
    logits, cache = _reference(params, tokens, cfg)
    assert report.baseline == inside.accuracy(logits, labels)
    for i in range(cfg.n_layers):
        np.testing.assert_allclose(report.mean_maps[i], cache[f"blocks.{i}.attn.weights"].mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(report.head_means[i], cache[f"blocks.{i}.attn.head_outputs"].mean(axis=0),
                                   atol=1e-12)
    for mode in inside.ABLATION_MODES:
        fill = report.head_means if mode == "mean" else None
        for layer, head in ((0, 0), (1, 1)):
            want = inside.accuracy(_reference(params, tokens, cfg, [(layer, head)], fill)[0], labels)
            assert report.accuracy[mode][layer, head] == want, (mode, layer, head)
            assert report.change(mode)[layer, head] == want - report.baseline
    # mean ablation: the removed head's output is its data-set mean at every position
    _, ablated = inside.forward(params, cfg, tokens, ablate={(0, 1): report.head_means[0, 1]})
    np.testing.assert_array_equal(ablated["blocks.0.attn.head_outputs"][:, 1],
                                  np.broadcast_to(report.head_means[0, 1], (40, cfg.n_ctx, cfg.d_k)))
    assert np.all((report.focus >= -1e-12) & (report.focus <= 1 + 1e-12))


# ----------------------------------------------------------------------------------------------
# the lesson's summaries
# ----------------------------------------------------------------------------------------------
def test_walkthrough_reads_every_number_from_the_cache():
    cfg = EncoderConfig(**SMALL)
    params = _params(cfg)
    _, cache = inside.forward(params, cfg, _tokens(cfg, 4))
    steps = inside.walkthrough(cache, params, cfg, layer=1, example=2)
    for step in steps:
        for name, value in step.arrays.items():
            want = params[name] if name in params else cache[name] if name == "pos_embed" else cache[name][2]
            np.testing.assert_array_equal(value, want, err_msg=f"{step.name}: {name}")
    by = {s.name: s for s in steps}
    assert list(by["residual sum x + attention"].arrays) == ["blocks.1.ln1.input"]
    assert "blocks.1.resid_post" in by["LayerNorm 2"].arrays
    assert by["FFN hidden relu(x W_1 + b_1)"].shape == "(T, d_ff) = (6, 12)"
    assert by["attention weights"].shape == "(H, T, T) = (2, 6, 6)"
    table = inside.layernorm_table(by["LayerNorm 1"])
    np.testing.assert_array_equal(table["mean before"], cache["blocks.1.ln1.mean"][2])
    np.testing.assert_array_equal(table["sqrt(var + eps) before"], cache["blocks.1.ln1.std"][2])
    np.testing.assert_array_equal(table["mean after gain and bias"], cache["blocks.1.resid_mid"][2].mean(axis=-1))
    np.testing.assert_allclose(table["mean of x-hat"], 0.0, atol=1e-12)
    off = inside.relu_off_fraction(by["FFN hidden relu(x W_1 + b_1)"].arrays["blocks.1.ffn.hidden"])
    np.testing.assert_array_equal(off, np.mean(cache["blocks.1.ffn.pre"][2] <= 0, axis=-1))
    with pytest.raises(ValueError, match="layer 3"):
        inside.walkthrough(cache, params, cfg, layer=2)
    with pytest.raises(ValueError, match="example 4"):
        inside.walkthrough(cache, params, cfg, layer=0, example=4)


def test_mean_pooling_averages_the_single_position_readouts():
    cfg = EncoderConfig(**SMALL)
    params, tokens = _params(cfg), _tokens(cfg, 30)
    logits, cache = inside.forward(params, cfg, tokens)
    per_position = inside.position_logits(cache, params, cfg)
    assert per_position.shape == (30, cfg.n_ctx, 3)
    np.testing.assert_allclose(per_position.mean(axis=1), logits, rtol=0, atol=1e-12)
    labels = np.argmax(per_position[:, 0], axis=1)
    mean_acc, single = inside.pooling_accuracy(cache, params, cfg, labels)
    assert single[0] == 1.0 and mean_acc == inside.accuracy(logits, labels)
    np.testing.assert_allclose(inside.head_averaged_attention(cache, 0, 3),
                               cache["blocks.0.attn.weights"][3].mean(axis=0))


# --- every number a walkthrough step shows, recomputed from the step before it ---------------------

def _close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=what)


def _layer_norm(x, g, b, eps):
    mu = x.mean(-1)
    rstd = 1.0 / np.sqrt(((x - mu[:, None]) ** 2).mean(-1) + eps)
    xhat = (x - mu[:, None]) * rstd[:, None]
    return mu, rstd, xhat, xhat * g + b


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_every_walkthrough_step_follows_from_the_one_before(positional):
    """Fails when a step shows another array of the cache (LayerNorm 1's output as its input), or when
    a residual sum leaves out the residual (``ln1_in = attn_out``): each array is recomputed here from
    the arrays of the steps before it and the parameters, not read from the cache."""
    cfg = EncoderConfig(**SMALL, positional=positional)
    params, tokens = _params(cfg), _tokens(cfg, 5)
    _, cache = inside.forward(params, cfg, tokens)
    H, dk, eps, T = cfg.n_heads, cfg.d_k, cfg.ln_eps, cfg.n_ctx
    example = 3
    h = None
    for layer in range(cfg.n_layers):
        steps = inside.walkthrough(cache, params, cfg, layer, example)
        emb = steps[0].arrays                                     # the embeddings: named outside any block
        s = {step.name: {name.removeprefix(f"blocks.{layer}."): value for name, value in step.arrays.items()}
             for step in steps}
        p = {name.removeprefix(f"blocks.{layer}."): v for name, v in params.items()
             if name.startswith(f"blocks.{layer}.")}
        _close(emb["token_embed"], params["embed"][tokens[example]], "token embeddings")
        pe = params["pos"][:T] if positional == "learned" else reference.sinusoidal(T, cfg.d_model)
        _close(emb["pos_embed"], pe, "positions")
        _close(emb["blocks.0.resid_pre"], emb["token_embed"] + emb["pos_embed"], "embeddings + positions")
        h = emb["blocks.0.resid_pre"] if layer == 0 else h        # h: the previous layer's LayerNorm 2 output
        _close(s[f"layer {layer + 1} input x"]["resid_pre"], h, "layer input")
        # attention, from h and the weights
        Q = (h @ p["attn.W_Q"] + p["attn.b_Q"]).reshape(T, H, dk).transpose(1, 0, 2)
        K = (h @ p["attn.W_K"] + p["attn.b_K"]).reshape(T, H, dk).transpose(1, 0, 2)
        V = (h @ p["attn.W_V"] + p["attn.b_V"]).reshape(T, H, dk).transpose(1, 0, 2)
        A = reference.softmax(Q @ K.transpose(0, 2, 1) / np.sqrt(dk))
        _close(s["attention weights"]["attn.weights"], A, "attention weights")
        concat = (A @ V).transpose(1, 0, 2).reshape(T, cfg.d_model)
        _close(s["heads' outputs, concatenated"]["attn.concat"], concat, "concat")
        attn_out = concat @ p["attn.W_O"] + p["attn.b_O"]
        _close(s["attention output concat W_O + b_O"]["attn.output"], attn_out, "attn_out")
        r1 = h + attn_out
        _close(s["residual sum x + attention"]["ln1.input"], r1, "residual sum 1")
        mu, rstd, xhat, out = _layer_norm(r1, p["ln1.g"], p["ln1.b"], eps)
        ln = s["LayerNorm 1"]
        for key, want in (("ln1.input", r1), ("ln1.mean", mu), ("ln1.std", 1 / rstd), ("ln1.normalized", xhat),
                          ("resid_mid", out), ("ln1.g", p["ln1.g"]), ("ln1.b", p["ln1.b"])):
            _close(ln[key], want, f"LayerNorm 1 {key}")
        x = out
        pre = x @ p["ffn.W_1"] + p["ffn.b_1"]
        ffn = s["FFN hidden relu(x W_1 + b_1)"]
        _close(ffn["ffn.pre"], pre, "FFN pre-activation")
        _close(ffn["ffn.hidden"], np.maximum(pre, 0.0), "FFN hidden")
        ffn_out = np.maximum(pre, 0.0) @ p["ffn.W_2"] + p["ffn.b_2"]
        _close(s["FFN output hidden W_2 + b_2"]["ffn.output"], ffn_out, "FFN output")
        r2 = x + ffn_out
        _close(s["residual sum x + FFN"]["ln2.input"], r2, "residual sum 2")
        mu, rstd, xhat, out = _layer_norm(r2, p["ln2.g"], p["ln2.b"], eps)
        ln = s["LayerNorm 2"]
        for key, want in (("ln2.input", r2), ("ln2.mean", mu), ("ln2.std", 1 / rstd), ("ln2.normalized", xhat),
                          ("resid_post", out), ("ln2.g", p["ln2.g"]), ("ln2.b", p["ln2.b"])):
            _close(ln[key], want, f"LayerNorm 2 {key}")
        h = out
    pooled = h.mean(axis=0)
    _close(s["mean over positions (after the last layer)"]["pooled"], pooled, "pooled")
    _close(s["logits pooled classifier.W + classifier.b"]["logits"],
           pooled @ params["classifier.W"] + params["classifier.b"], "logits")


def test_mean_ablation_fills_a_head_with_its_mean_and_zero_ablation_with_nothing():
    """Fails when "mean" ablation acts as "zero" (``fill = None`` for both modes): the labels here are
    the mean-ablated model's own predictions (so mean ablation scores 1.0), on which zero ablation
    predicts differently; the two are computed by the plain NumPy oracle."""
    cfg = EncoderConfig(**SMALL)
    params, X = _params(cfg, seed=2), _tokens(cfg, 40)
    heads = [(0, 0), (0, 1)]                     # every head of layer 1: here the two ablations disagree
    _, _, means = inside.clean_statistics(params, cfg, X)
    zero_logits = _reference(params, X, cfg, heads, None)[0]
    mean_logits = _reference(params, X, cfg, heads, means)[0]
    y = np.argmax(mean_logits, axis=1)
    zero_acc = float(np.mean(np.argmax(zero_logits, axis=1) == y))
    assert zero_acc < 1.0                                            # the two ablations disagree here
    assert inside.ablated_accuracy(params, cfg, X, y, heads, "mean", means) == 1.0
    assert inside.ablated_accuracy(params, cfg, X, y, heads, "zero") == zero_acc
    report = inside.head_ablation(params, cfg, X, y)
    for mode, fill in (("zero", None), ("mean", report.head_means)):
        for layer, head in ((0, 0), (1, 1)):
            want = np.mean(np.argmax(_reference(params, X, cfg, [(layer, head)], fill)[0], axis=1) == y)
            assert report.accuracy[mode][layer, head] == want, (mode, layer, head)
