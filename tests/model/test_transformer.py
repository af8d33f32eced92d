"""The settings-driven transformer against `transformers`' GPT-2 (random weights, no download), and
its own invariants: the KV cache, head edits, post-norm settings."""
import numpy as np
import pytest

from core.model.formats import gpt2
from core.model import transformer as tr
from core.model import config as C
from oracle_support import require

TINY = dict(vocab_size=50, n_positions=32, n_embd=16, n_head=4, n_layer=2)
INNER = dict(vocab_size=40, n_positions=16, n_embd=12, n_head=3, n_layer=3, n_inner=20)
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_head=12, n_layer=12)


def random_gpt2(settings: dict, seed: int = 0):
    """A `GPT2LMHeadModel` with every parameter random, LayerNorm gains and biases included."""
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**settings, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("weight") and ".ln_" in name or name.startswith("transformer.ln_f.weight"):
                value.copy_(1.0 + 0.2 * torch.randn_like(value))          # LayerNorm gains near 1
            else:
                value.copy_(0.08 * torch.randn_like(value))
    return model


def run_both(settings: dict, dtype, T: int = 7, B: int = 2, seed: int = 0):
    """transformers' outputs and ours (logits, cache, config, params) on the same random ids."""
    torch = require("torch")
    model = random_gpt2(settings, seed)
    if dtype == np.float64:
        model = model.double()
    ids = np.random.default_rng(seed).integers(0, settings["vocab_size"], size=(B, T))
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), output_attentions=True, output_hidden_states=True)
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    cfg, params = gpt2.params_from(tensors, gpt2.config_from(model.config.to_dict()), dtype)
    logits, cache = tr.forward(params, cfg, ids)
    return ref, (logits, cache, cfg, params)


def close(ours, ref, dtype):
    ref = ref.detach().numpy()
    assert ours.dtype == dtype
    if dtype == np.float64:
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(ref).max()))
    else:
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def final_hidden(cache: dict, cfg, params) -> np.ndarray:
    """The last block's output through the final LayerNorm, from the cache's statistics: what
    transformers reports as its last hidden state."""
    last = cache[f"blocks.{cfg.n_layers - 1}.resid_post"]
    normed = (last - cache["ln_final.mean"][..., None]) / cache["ln_final.std"][..., None]
    return normed * params["ln_final.g"] + params["ln_final.b"]


def compare(ref, ours, dtype):
    logits, cache, cfg, params = ours
    close(logits, ref.logits, dtype)
    assert len(ref.hidden_states) == cfg.n_layers + 1 and len(ref.attentions) == cfg.n_layers
    for i in range(cfg.n_layers):
        close(cache[f"blocks.{i}.attn.weights"], ref.attentions[i], dtype)         # (B, H, T, T)
        close(cache[f"blocks.{i}.resid_pre"], ref.hidden_states[i], dtype)          # embeddings, then each block's input
    close(final_hidden(cache, cfg, params), ref.hidden_states[-1], dtype)           # after ln_f


@pytest.mark.parametrize("settings", [TINY, INNER], ids=["tiny", "n_inner"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_matches_transformers_gpt2(settings, dtype):
    ref, ours = run_both(settings, dtype)
    compare(ref, ours, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_matches_full_gpt2_small(dtype):
    """The full GPT-2 small configuration (12 layers x 12 heads, d 768, 50,257 tokens, 1,024
    positions), one short forward."""
    ref, ours = run_both(GPT2_SMALL, dtype, T=5, B=1)
    assert ours[0].shape == (1, 5, 50257) and ours[2].d_ff == 3072 and ours[2].n_ctx == 1024
    compare(ref, ours, dtype)


SEED_CFG = C.TransformerConfig(vocab_size=13, n_ctx=12, d_model=8, n_heads=2, d_ff=16, n_layers=2)
GPT_CFG = C.TransformerConfig(vocab_size=13, n_ctx=12, d_model=8, n_heads=2, d_ff=16, n_layers=2, norm_placement="pre",
                               activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)


@pytest.mark.parametrize("cfg", [SEED_CFG, GPT_CFG], ids=["post-norm", "pre-norm"])
def test_kv_cache_gives_the_full_forward(cfg):
    params = C.init_params(cfg, seed=1, dtype=np.float64)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    full, _ = tr.forward(params, cfg, ids)
    kv = [{} for _ in range(cfg.n_layers)]
    first, _ = tr.forward(params, cfg, ids[:, :5], kv=kv)
    steps = [tr.forward(params, cfg, ids[:, t:t + 1], kv=kv, start=t)[0] for t in range(5, 8)]
    np.testing.assert_allclose(np.concatenate([first] + steps, axis=1), full, rtol=1e-12, atol=1e-12)


def test_head_edits():
    params = C.init_params(GPT_CFG, seed=2, dtype=np.float64)
    ids = np.array([3, 1, 4, 1, 5, 9])
    logits, cache = tr.forward(params, GPT_CFG, ids)
    Z = cache["blocks.1.attn.head_outputs"]                                  # (1, H, T, d_k)
    zeroed, cz = tr.forward(params, GPT_CFG, ids, ablate={(1, 0): "zero"})
    assert np.all(cz["blocks.1.attn.head_outputs"][:, 0] == 0)
    np.testing.assert_array_equal(cz["blocks.1.attn.head_outputs"][:, 1], Z[:, 1])   # the other head untouched
    assert np.abs(zeroed - logits).max() > 1e-3
    _, cm = tr.forward(params, GPT_CFG, ids, ablate={(1, 0): "mean"})
    np.testing.assert_allclose(cm["blocks.1.attn.head_outputs"][0, 0], np.broadcast_to(Z[0, 0].mean(0), Z[0, 0].shape))
    same, _ = tr.forward(params, GPT_CFG, ids, ablate={(1, 0): Z[0, 0]})   # patching a head with itself
    np.testing.assert_allclose(same, logits, rtol=1e-13, atol=1e-13)
    for bad in ({(2, 0): "zero"}, {(0, 5): "zero"}, {(0, 0): "half"}, {(0, 0): np.zeros((3, 4))}):
        with pytest.raises(ValueError):
            tr.forward(params, GPT_CFG, ids, ablate=bad)


LLAMA_CFG = C.TransformerConfig(vocab_size=50, n_ctx=32, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=3,
                                norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                                positional="rotary", bias=False, tied_unembed=True, final_ln=True)


def test_a_pass_keeps_only_the_block_entries_asked_for_and_holds_no_more_meanwhile():
    import tracemalloc
    params = C.init_params(LLAMA_CFG, seed=3, dtype=np.float64)
    ids = np.random.default_rng(0).integers(0, 50, size=(4, 24))
    tr.forward(params, LLAMA_CFG, ids)                   # imports and compiles, before memory is traced
    tracemalloc.start()
    try:
        logits, full = tr.forward(params, LLAMA_CFG, ids)
        peak_full = tracemalloc.get_traced_memory()[1]
        del full
        tracemalloc.reset_peak()
        kept_logits, kept = tr.forward(params, LLAMA_CFG, ids, keep=("attn.weights", "resid_post"))
        peak_kept = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(kept_logits, logits)
    _, full = tr.forward(params, LLAMA_CFG, ids)
    expected = {name for name in full if not name.startswith("blocks.")
                or name.split(".", 2)[2] in ("attn.weights", "resid_post")}
    assert set(kept) == expected and "blocks.2.attn.weights" in kept and "blocks.0.ffn.gate" not in kept
    for name in kept:
        np.testing.assert_array_equal(kept[name], full[name])
    # the entries not kept are dropped as the pass goes, not at its end: its peak is well below the whole cache's
    assert peak_kept < 0.5 * peak_full, (peak_kept, peak_full)
    for bad in ("attn.weights", (1, 2)):                  # a bare name would be read letter by letter
        with pytest.raises(ValueError, match="keep names"):
            tr.forward(params, LLAMA_CFG, ids, keep=bad)


def test_bad_inputs_are_refused_in_plain_words():
    params = C.init_params(SEED_CFG, dtype=np.float64)
    for tokens in ([], [[1, 99]], np.arange(13), [0.5, 1.0]):
        with pytest.raises(ValueError):
            tr.forward(params, SEED_CFG, tokens)
    with pytest.raises(ValueError, match="cannot be split"):
        C.TransformerConfig(vocab_size=5, n_ctx=4, d_model=6, n_heads=4, d_ff=8, n_layers=1)
    with pytest.raises(ValueError, match="norm_placement"):
        C.TransformerConfig(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, d_ff=8, n_layers=1, norm_placement="middle")
    with pytest.raises(ValueError, match="missing"):
        tr.forward({k: v for k, v in params.items() if k != "unembed"}, SEED_CFG, [1, 2])


def test_tiny_gpt_gradient_matches_finite_differences():
    """The backward pass that trains the shipped checkpoint (the one transformer's), against central differences."""
    from core.training import make_tiny_gpt
    from core.model import layers as L

    cfg = C.TransformerConfig(vocab_size=11, n_ctx=6, d_model=8, n_heads=2, d_ff=12, n_layers=2, norm_placement="pre",
                               activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in C.init_params(cfg, 3, np.float64).items()}
    x, y = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    loss, grads = make_tiny_gpt.loss_and_grads(params, cfg, x, y)
    assert loss == pytest.approx(L.cross_entropy(tr.forward(params, cfg, x)[0], y)[0], rel=1e-12)
    for name, value in params.items():
        for _ in range(2):
            idx = tuple(int(rng.integers(0, s)) for s in value.shape)
            bumped = {k: v.copy() for k, v in params.items()}
            bumped[name][idx] += 1e-6
            up = make_tiny_gpt.loss_and_grads(bumped, cfg, x, y)[0]
            bumped[name][idx] -= 2e-6
            down = make_tiny_gpt.loss_and_grads(bumped, cfg, x, y)[0]
            assert (up - down) / 2e-6 == pytest.approx(grads[name][idx], abs=1e-7), name


def test_attention_only_classifier_and_output_bias_settings():
    """d_ff=0 leaves no feed-forward sublayer (nor ln2); a classifier averages the last hidden
    states over positions; unembed_b is added to every position's logits."""
    attn_only = C.TransformerConfig(vocab_size=7, n_ctx=6, d_model=8, n_heads=2, d_ff=0, n_layers=2)
    params = C.init_params(attn_only, seed=1, dtype=np.float64)
    assert not any(".ffn." in n or ".ln2." in n for n in params)
    _, cache = tr.forward(params, attn_only, [1, 2, 3])
    assert not any(".ffn." in n or ".ln2." in n for n in cache)
    np.testing.assert_array_equal(cache["blocks.0.resid_post"], cache["blocks.0.resid_mid"])

    classify = C.TransformerConfig(vocab_size=7, n_ctx=6, d_model=8, n_heads=2, d_ff=4, n_layers=1,
                                    causal=False, head="classify", n_classes=3)
    params = C.init_params(classify, seed=2, dtype=np.float64)
    assert params["classifier.W"].shape == (8, 3) and "unembed" not in params
    logits, cache = tr.forward(params, classify, [[1, 2, 3], [4, 5, 6]])
    pooled = cache["blocks.0.resid_post"].mean(axis=1)
    np.testing.assert_allclose(logits, pooled @ params["classifier.W"] + params["classifier.b"], rtol=1e-13)

    biased = C.TransformerConfig(vocab_size=7, n_ctx=6, d_model=8, n_heads=2, d_ff=4, n_layers=1, unembed_b=True)
    params = C.init_params(biased, seed=3, dtype=np.float64)
    params["unembed_b"] = np.arange(7.0)
    logits, cache = tr.forward(params, biased, [1, 2])
    np.testing.assert_allclose(logits - cache["blocks.0.resid_post"] @ params["unembed"], np.broadcast_to(np.arange(7.0), logits.shape),
                               atol=1e-12)
    for bad in (dict(head="classify"), dict(head="classify", n_classes=3, tied_unembed=True), dict(n_classes=3),
                dict(head="pool"), dict(d_ff=-1)):
        with pytest.raises(ValueError):
            C.TransformerConfig(**{**dict(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, d_ff=8, n_layers=1), **bad})


@pytest.mark.parametrize("setting", ["norm", "norm_placement", "activation", "positional"])
def test_an_unknown_choice_is_refused_naming_the_registered_ones(setting):
    from core.model import activations, norms, positions

    registered = {"norm": norms.NORMS, "norm_placement": norms.PLACEMENTS, "activation": activations.ACTIVATIONS,
                  "positional": positions.POSITIONS}[setting]
    with pytest.raises(ValueError, match=setting) as refused:
        C.TransformerConfig(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, d_ff=8, n_layers=1, **{setting: "swish"})
    assert all(name in str(refused.value) for name in registered)


def test_a_forward_pass_chooses_the_tuned_twins_once(monkeypatch):
    """At GPT-2's sizes the tuned twins run once they are compiled; the pass asks once, so a compile
    that finishes (or a readiness that changes) mid-pass cannot mix the two kinds of step."""
    from core.model import layers as L
    from core.model import multi_head as MH
    from core.model.tuned import forward as TF
    from core.recording import recording

    cfg = C.TransformerConfig(vocab_size=20, n_ctx=8, d_model=384, n_heads=6, d_ff=64, n_layers=2,
                              norm_placement="pre", activation="gelu_tanh", positional="learned")
    assert cfg.d_model ** 2 >= L.BLAS_FROM
    params = C.init_params(cfg, seed=0, dtype=np.float32)
    asked = []
    monkeypatch.setattr(TF, "ready", lambda dtype: asked.append(dtype) or len(asked) == 1)   # ready, then not
    with recording() as ran:
        tr.forward(params, cfg, [1, 2, 3, 4])
    assert len(asked) == 1
    assert {TF.softmax_rows, TF.gelu_tanh} <= set(ran.functions())
    assert not {MH.softmax_rows, L.gelu_tanh} & set(ran.functions())
