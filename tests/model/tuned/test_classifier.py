"""The tiny encoder: gradients against finite differences, forward against a NumPy oracle,
invariants, Adam, save/load and the errors a user can trigger."""
import io

import numpy as np
import pytest

from core import encoder
from core.kernels import reference
from core.model import encoder_io
from core.model.config import param_count, param_shapes
from core.model.tuned.classifier import EncoderConfig
from core.model.optim import Adam
from core.model.params import pack

SMALL = dict(vocab_size=7, seq_len=5, d_model=8, n_heads=2, d_ff=12, n_layers=2, n_classes=3)


def _perturbed_params(cfg, seed=1):
    """float64 parameters with non-trivial biases and layer-norm gains (so every path is exercised)."""
    params = encoder.init_params(cfg, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 100)
    for name, value in params.items():
        if value.ndim == 1:
            value += 0.3 * rng.standard_normal(value.shape)
    return params


def _reference_forward(params, tokens, cfg):
    """Plain NumPy, written like the formulas, on top of ``core.kernels.reference``."""
    B, T = tokens.shape
    if cfg.positional == "sinusoidal":
        pe = reference.sinusoidal(T, cfg.d_model)
    elif cfg.positional == "learned":
        pe = params["pos"][:T]
    else:
        pe = 0.0
    h = params["embed"][tokens] + pe                                            # (B, T, d)

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.ln_eps) * g + b

    weights = []
    for i in range(cfg.n_layers):
        p = {k.removeprefix(f"blocks.{i}."): v for k, v in params.items() if k.startswith(f"blocks.{i}.")}
        mha = reference.multi_head_attention(h, p["attn.W_Q"], p["attn.W_K"], p["attn.W_V"], p["attn.W_O"],
                                             cfg.n_heads, b_Q=p["attn.b_Q"], b_K=p["attn.b_K"], b_V=p["attn.b_V"],
                                             b_O=p["attn.b_O"])
        weights.append(mha["weights"])
        h = layer_norm(h + mha["output"], p["ln1.g"], p["ln1.b"])
        ffn = np.maximum(h @ p["ffn.W_1"] + p["ffn.b_1"], 0.0) @ p["ffn.W_2"] + p["ffn.b_2"]
        h = layer_norm(h + ffn, p["ln2.g"], p["ln2.b"])
    logits = h.mean(axis=1) @ params["classifier.W"] + params["classifier.b"]
    return logits, np.stack(weights)


def _loss(params, tokens, labels, cfg):
    logits, _ = encoder.forward(params, tokens, cfg)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def _check_gradients(cfg, T, seed=0, per_param=6, batch=3):
    params = _perturbed_params(cfg, seed=seed + 1)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, size=(batch, T))
    labels = rng.integers(0, cfg.n_classes, size=batch)
    loss, grads = encoder.loss_and_grads(params, tokens, labels, cfg)
    assert loss == pytest.approx(_loss(params, tokens, labels, cfg), rel=1e-12)
    assert set(grads) == set(params)
    # a key bias adds q . b_K to every score of a row, which the softmax cancels: its gradient is 0;
    # with one position the weight is 1 whatever Q and K are, so their gradients are 0 as well
    zero = ("b_K",) if T > 1 else ("b_K", "b_Q", "W_Q", "W_K")
    step = 1e-5
    for name, value in params.items():
        assert grads[name].shape == value.shape and grads[name].dtype == value.dtype
        picks = rng.choice(value.size, size=min(per_param, value.size), replace=False)
        numeric, analytic = [], []
        for flat_index in picks:
            idx = np.unravel_index(flat_index, value.shape)
            old = value[idx]
            value[idx] = old + step
            up = _loss(params, tokens, labels, cfg)
            value[idx] = old - step
            down = _loss(params, tokens, labels, cfg)
            value[idx] = old
            numeric.append((up - down) / (2 * step))
            analytic.append(grads[name][idx])
        numeric, analytic = np.array(numeric), np.array(analytic)
        scale = np.linalg.norm(numeric) + np.linalg.norm(analytic)
        if name.endswith(zero):
            assert np.abs(analytic).max() < 1e-12 and np.abs(numeric).max() < 1e-8, name
            continue
        assert scale > 1e-8, f"{name}: gradient vanished, the check would prove nothing"
        rel = np.linalg.norm(numeric - analytic) / scale
        assert rel < 1e-6, f"{name}: relative error {rel:.2e}"


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "none"])
def test_gradients_match_finite_differences(positional):
    _check_gradients(EncoderConfig(**SMALL, positional=positional), T=5)


def test_gradients_single_token_and_short_sequences():
    _check_gradients(EncoderConfig(**SMALL, positional="learned"), T=1, seed=3)
    _check_gradients(EncoderConfig(**SMALL, positional="learned"), T=3, seed=4)


def test_sizes_that_are_not_whole_tiles_and_batches_of_several_chunks():
    """d_model 6, d_ff 10, d_k 3 (no product a whole number of register tiles) and 21 sequences
    (two chunks, the second padded with dummy sequences): forward against the reference, the
    gradient against finite differences."""
    cfg = EncoderConfig(vocab_size=5, seq_len=4, d_model=6, n_heads=2, d_ff=10, n_layers=2, n_classes=2,
                        positional="learned")
    params = _perturbed_params(cfg, seed=7)
    tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, size=(21, 4))
    logits, cache = encoder.forward(params, tokens, cfg)
    want_logits, want_attn = _reference_forward(params, tokens, cfg)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cache["attn"], want_attn, rtol=1e-10, atol=1e-13)
    _check_gradients(cfg, T=4, seed=9, per_param=4, batch=21)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "none"])
def test_forward_matches_numpy_reference(positional):
    cfg = EncoderConfig(**SMALL, positional=positional)
    params = _perturbed_params(cfg)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(4, 5))
    logits, cache = encoder.forward(params, tokens, cfg)
    want_logits, want_attn = _reference_forward(params, tokens, cfg)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cache["attn"], want_attn, rtol=1e-10, atol=1e-13)


def test_forward_shapes_and_attention_rows():
    cfg = EncoderConfig()
    params = encoder.init_params(cfg)
    tokens = np.random.default_rng(0).integers(0, 10, size=(6, 16))
    logits, cache = encoder.forward(params, tokens, cfg)
    assert logits.shape == (6, 2) and logits.dtype == np.float32
    assert cache["attn"].shape == (2, 6, 4, 16, 16)
    assert cache["hidden"].shape == (6, 16, 32)
    np.testing.assert_allclose(cache["attn"].sum(-1), 1.0, rtol=1e-5)
    assert (cache["attn"] >= 0).all()
    # one sequence without a batch axis is a batch of one; shorter sequences are fine
    one, _ = encoder.forward(params, tokens[0], cfg)
    np.testing.assert_allclose(one, logits[:1], rtol=1e-5, atol=1e-6)
    short, cache = encoder.forward(params, tokens[:, :3], cfg)
    assert short.shape == (6, 2) and cache["attn"].shape == (2, 6, 4, 3, 3)


def test_float32_agrees_with_float64():
    cfg = EncoderConfig()
    p64 = encoder.init_params(cfg, seed=2, dtype=np.float64)
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    tokens = np.random.default_rng(1).integers(0, 10, size=(8, 16))
    labels = np.arange(8) % 2
    l64, g64 = encoder.loss_and_grads(p64, tokens, labels, cfg)
    l32, g32 = encoder.loss_and_grads(p32, tokens, labels, cfg)
    assert l32 == pytest.approx(l64, rel=1e-4)
    for name in g64:
        assert g32[name].dtype == np.float32
        np.testing.assert_allclose(g32[name], g64[name], rtol=1e-2, atol=1e-4, err_msg=name)


def test_init_is_deterministic_and_named_as_designed():
    cfg = EncoderConfig(positional="learned")
    a, b = encoder.init_params(cfg, seed=5), encoder.init_params(cfg, seed=5)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["embed"], encoder.init_params(cfg, seed=6)["embed"])
    assert a["pos"].shape == (16, 32) and a["blocks.1.ffn.W_1"].shape == (32, 64)
    assert a["classifier.W"].shape == (32, 2) and a["classifier.b"].shape == (2,)
    assert "pos" not in encoder.init_params(EncoderConfig())
    assert list(a) == list(param_shapes(cfg)) and len(a) == 1 + 1 + 2 * 16 + 2
    assert param_count(cfg) == sum(v.size for v in a.values())


def test_adam_matches_textbook_formula():
    rng = np.random.default_rng(0)
    p = rng.standard_normal(50)
    flat = p.copy()
    opt = Adam(50, np.float64, lr=0.01)
    m = v = np.zeros(50)
    for t in range(1, 6):
        g = rng.standard_normal(50)
        opt.step(flat, g)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p = p - 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(flat, p, rtol=1e-12)
    again = Adam.from_state_dict(opt.state_dict())
    assert again.t == 5 and np.array_equal(again.m, opt.m)


def test_pack_gives_views_of_one_buffer():
    params = encoder.init_params(EncoderConfig())
    flat, views = pack(params)
    assert all(np.array_equal(views[k], params[k]) for k in params)
    flat[:] = 0.0
    assert all((v == 0).all() for v in views.values())


def test_save_load_round_trip(tmp_path):
    cfg = EncoderConfig(positional="learned", n_layers=3, d_model=16, n_heads=2)
    params = encoder.init_params(cfg, seed=3)
    path = tmp_path / "model.npz"
    encoder_io.save(params, path)
    loaded = encoder_io.load(path, cfg)
    assert set(loaded) == set(params)
    assert all(np.array_equal(loaded[k], params[k]) and loaded[k].dtype == params[k].dtype for k in params)
    buffer = io.BytesIO()
    encoder_io.save(params, buffer)
    assert set(encoder_io.load(buffer.getvalue())) == set(params)
    inferred = encoder_io.infer_config(loaded)
    assert (inferred.n_layers, inferred.d_model, inferred.positional, inferred.n_ctx) == (3, 16, "learned", 16)


# A file saved before the one vocabulary: a block's arrays under "layers.{i}." and these short
# names, the classifier as W_cls and b_cls
OLD_BLOCK_NAMES = {"attn.W_Q": "W_Q", "attn.W_K": "W_K", "attn.W_V": "W_V", "attn.W_O": "W_O",
                   "attn.b_Q": "b_Q", "attn.b_K": "b_K", "attn.b_V": "b_V", "attn.b_O": "b_O",
                   "ln1.g": "ln1_g", "ln1.b": "ln1_b", "ln2.g": "ln2_g", "ln2.b": "ln2_b",
                   "ffn.W_1": "W_1", "ffn.b_1": "b_1", "ffn.W_2": "W_2", "ffn.b_2": "b_2"}


def _old_name(name):
    if name in ("classifier.W", "classifier.b"):
        return {"classifier.W": "W_cls", "classifier.b": "b_cls"}[name]
    if name.startswith("blocks."):
        _, i, short = name.split(".", 2)
        return f"layers.{i}.{OLD_BLOCK_NAMES[short]}"
    return name


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_a_file_saved_under_the_older_names_loads_to_the_same_arrays(tmp_path, positional):
    cfg = EncoderConfig(positional=positional, n_layers=2, d_model=16, n_heads=2)
    params = _perturbed_params(cfg, seed=4)
    old = {_old_name(name): value for name, value in params.items()}
    assert "W_cls" in old and "layers.1.ln2_b" in old and not any(k.startswith("blocks.") for k in old)
    path = _save_dict(tmp_path, {**old, "config.n_heads": np.array(2)}, "old.npz")
    for loaded, rebuilt in ((encoder_io.load(path, cfg), cfg), encoder_io.load_with_settings(path)[:2]):
        assert rebuilt == cfg and list(loaded) == list(param_shapes(cfg))
        assert all(np.array_equal(loaded[k], params[k]) and loaded[k].dtype == params[k].dtype for k in params)
    with pytest.raises(ValueError, match="twice"):
        encoder_io.load(_save_dict(tmp_path, {**params, "W_cls": params["classifier.W"]}), cfg)


def test_saved_settings_rebuild_the_config(tmp_path):
    """Heads and positional encoding are not in the weights' shapes: save stores them and a load
    without a config rebuilds exactly the saved one; a file without them gets the defaults."""
    cfg = EncoderConfig(positional="none", n_layers=2, d_model=12, n_heads=3)
    params = encoder.init_params(cfg, seed=1)
    path = tmp_path / "model.npz"
    encoder_io.save(params, path, cfg)
    loaded, rebuilt, settings = encoder_io.load_with_settings(path)
    assert settings == {"n_heads": 3, "positional": "none"} and rebuilt == cfg
    assert set(loaded) == set(params)                       # the settings are not parameters
    assert set(encoder_io.load(path, cfg)) == set(params)
    encoder_io.save(params, path)
    _, plain, settings = encoder_io.load_with_settings(path)
    assert settings == {} and (plain.n_heads, plain.positional) == (4, "sinusoidal")


@pytest.mark.parametrize("bad, message", [
    ({"config.n_heads": np.array(2.5)}, "not one this encoder knows"),
    ({"config.n_heads": np.array([2, 2])}, "not one this encoder knows"),
    ({"config.positional": np.array("rotary")}, "not one this encoder knows"),
    ({"config.colour": np.array(1)}, "not one this encoder knows"),
    ({"config.n_heads": np.array(5)}, "divide"),               # 5 does not divide d_model = 32
    ({"config.positional": np.array("sinusoidal"), "pos": np.zeros((16, 32))}, "learned position table"),
])
def test_bad_saved_settings_are_refused(tmp_path, bad, message):
    arrays = dict(encoder.init_params(EncoderConfig(), seed=0), **bad)
    with pytest.raises(ValueError, match=message):
        encoder_io.load(_save_dict(tmp_path, arrays))


def _save_dict(tmp_path, arrays, name="bad.npz"):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def test_load_rejects_bad_files(tmp_path):
    cfg = EncoderConfig()
    good = encoder.init_params(cfg)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive at all")
    with pytest.raises(ValueError, match="not a valid .npz"):
        encoder_io.load(junk, cfg)
    saved = _save_dict(tmp_path, good, "good.npz")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(saved.read_bytes()[:300])
    with pytest.raises(ValueError, match="Could not read"):
        encoder_io.load(truncated, cfg)
    with pytest.raises(ValueError, match="does not exist"):
        encoder_io.load(tmp_path / "missing.npz", cfg)
    missing = {k: v for k, v in good.items() if k != "blocks.1.attn.W_O"}
    with pytest.raises(ValueError, match="missing blocks.1.attn.W_O"):
        encoder_io.load(_save_dict(tmp_path, missing), cfg)
    with pytest.raises(ValueError, match="shape"):
        encoder_io.load(_save_dict(tmp_path, {**good, "classifier.W": np.zeros((32, 3), np.float32)}), cfg)
    with pytest.raises(ValueError, match="NaN"):
        encoder_io.load(_save_dict(tmp_path, {**good, "classifier.b": np.array([np.nan, 0], np.float32)}), cfg)
    with pytest.raises(ValueError, match="dtype|float"):
        encoder_io.load(_save_dict(tmp_path, {**good, "classifier.b": np.zeros(2, np.int64)}), cfg)
    with pytest.raises(ValueError, match="Unexpected"):
        encoder_io.load(_save_dict(tmp_path, {**good, "extra": np.zeros(2, np.float32)}), cfg)
    with pytest.raises(ValueError, match="Could not read"):   # a pickled object array is never unpickled
        encoder_io.load(_save_dict(tmp_path, {**good, "classifier.b": np.array([{"x": 1}, None], dtype=object)}), cfg)
    with pytest.raises(ValueError, match="embed"):
        encoder_io.load(_save_dict(tmp_path, {"weights": np.zeros(3)}))


def test_config_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="cannot be split evenly"):
        EncoderConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="d_ff must be a positive"):
        EncoderConfig(d_ff=-1)
    with pytest.raises(ValueError, match="n_layers must be a positive"):
        EncoderConfig(n_layers=-1)
    with pytest.raises(ValueError, match="positional must be one of"):
        EncoderConfig(positional="rotary")
    with pytest.raises(ValueError, match="ln_eps"):
        EncoderConfig(ln_eps=0.0)


def test_input_errors_say_what_is_wrong():
    cfg = EncoderConfig()
    params = encoder.init_params(cfg)
    with pytest.raises(ValueError, match="0..9"):
        encoder.forward(params, np.full((2, 4), 10), cfg)
    with pytest.raises(ValueError, match="n_ctx = 16"):
        encoder.forward(params, np.zeros((2, 17), int), cfg)
    with pytest.raises(ValueError, match="whole-number"):
        encoder.forward(params, np.full((2, 4), 0.5), cfg)
    with pytest.raises(ValueError, match="Labels"):
        encoder.loss_and_grads(params, np.zeros((2, 4), int), np.array([0, 2]), cfg)
    with pytest.raises(ValueError, match="shape"):
        encoder.forward(params, np.zeros((2, 4), int), EncoderConfig(d_model=16))


def test_cuda_backend_runs_the_cpu_kernels_or_says_no_gpu():
    """``backend="cuda"`` runs the encoder's CPU kernels where CUDA can run (a GPU, or the
    simulator the tests enable), and is refused with a clear error where it cannot; either way,
    what it returns is checked against the NumPy reference, not against another call of itself."""
    from core import backend
    cfg = EncoderConfig(**SMALL)
    params = _perturbed_params(cfg)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(3, 5))
    labels = np.array([0, 2, 1])
    want_logits, want_attn = _reference_forward(params, tokens, cfg)
    z = want_logits - want_logits.max(axis=1, keepdims=True)
    want_loss = -(z - np.log(np.exp(z).sum(axis=1, keepdims=True)))[np.arange(3), labels].mean()
    for name in ("cpu", "cuda"):
        if name == "cuda" and not backend.cuda_usable():
            with pytest.raises(ValueError, match="no CUDA GPU"):
                encoder.forward(params, tokens, cfg, backend="cuda")
            with pytest.raises(ValueError, match="no CUDA GPU"):
                encoder.loss_and_grads(params, tokens, labels, cfg, backend="cuda")
            continue
        logits, cache = encoder.forward(params, tokens, cfg, backend=name)
        np.testing.assert_allclose(logits, want_logits, rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(cache["attn"], want_attn, rtol=1e-10, atol=1e-13, err_msg=name)
        loss, _ = encoder.loss_and_grads(params, tokens, labels, cfg, backend=name)
        assert loss == pytest.approx(want_loss, rel=1e-12), name


def test_the_encoder_does_not_import_the_reference():
    """Product code never uses the oracle (its positional table included): a check against the
    reference would otherwise compare the reference with itself."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
    code = "import sys, core.model.tuned.classifier, core.training.encoder_runs; sys.exit('core.kernels.reference' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or "core.model.tuned.classifier imported core.kernels.reference"
