"""The decoder (encoder-decoder and decoder-only): gradients against finite differences and PyTorch,
the causal mask, generation with and without the KV cache, the tasks, training results, and the
errors a user can trigger."""
import time

import numpy as np
import pytest

from core import tasks
from core.kernels import reference
from core.model import decoder as D
from core.model import layers, presets
from core.model.tuned import decoder_loss
from core.model.decoder import DecoderConfig
from core.model.generation import attention_weights
from core.model.transformer_encdec import EncoderDecoderConfig, target_stack
from core.training import decoder_runs
from oracle_support import require

ENC_DEC = dict(vocab_size=5, tgt_len=4, d_model=4, n_heads=2, d_ff=6, n_layers=2,
               cross_attention=True, src_vocab_size=6, src_len=3)
DEC_ONLY = dict(vocab_size=5, tgt_len=4, d_model=4, n_heads=2, d_ff=6, n_layers=2, cross_attention=False)
KINDS = {"encoder-decoder": ENC_DEC, "decoder-only": DEC_ONLY}
# d_ff=0: no feed-forward sublayer (and no ln2) in any layer, the attention-only models
GRADIENT_KINDS = {**KINDS, "decoder-only, attention-only": dict(DEC_ONLY, d_ff=0),
                  "encoder-decoder, attention-only": dict(ENC_DEC, d_ff=0)}


def _perturbed_params(cfg, seed=1):
    """float64 parameters with non-trivial biases and layer-norm gains (so every path is exercised)."""
    params = D.init_params(cfg, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 100)
    for value in params.values():
        if value.ndim == 1:
            value += 0.3 * rng.standard_normal(value.shape)
    return params


def _batch(cfg, B=3, seed=2):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, cfg.encoder.vocab_size, (B, cfg.encoder.n_ctx)) if _seq2seq(cfg) else None
    target = target_stack(cfg)
    tgt_in = rng.integers(0, target.vocab_size, (B, target.n_ctx))
    tgt_out = rng.integers(0, target.vocab_size, (B, target.n_ctx))
    return src, tgt_in, tgt_out


def _seq2seq(cfg) -> bool:
    return isinstance(cfg, EncoderDecoderConfig)


def _loss(params, cfg, tgt_in, tgt_out, src):
    """Mean cross-entropy from the public forward pass, written out here."""
    logits, _ = D.forward(params, cfg, tgt_in, src)
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(logp, tgt_out[..., None], axis=-1).mean()


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", GRADIENT_KINDS)
def test_every_gradient_matches_central_differences(kind):
    cfg = DecoderConfig(**GRADIENT_KINDS[kind], positional="learned")         # learned: the position tables get checked too
    params = _perturbed_params(cfg)
    src, tgt_in, tgt_out = _batch(cfg)
    loss, grads = D.loss_and_grads(params, cfg, tgt_in, tgt_out, src)
    assert loss == pytest.approx(_loss(params, cfg, tgt_in, tgt_out, src), rel=1e-13)
    assert list(grads) == list(params)
    assert target_stack(cfg).d_ff > 0 or not [name for name in params if name.endswith(("W_1", "b_2", "ln2.g"))]
    h, vanishing = 1e-5, []
    for name, value in params.items():
        assert grads[name].shape == value.shape and grads[name].dtype == np.float64
        fd = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            old = value[idx]
            value[idx] = old + h
            up = _loss(params, cfg, tgt_in, tgt_out, src)
            value[idx] = old - h
            down = _loss(params, cfg, tgt_in, tgt_out, src)
            value[idx] = old
            fd[idx] = (up - down) / (2 * h)
        scale = max(np.linalg.norm(fd), np.linalg.norm(grads[name]))
        if scale < 1e-8:
            vanishing.append(name)
            continue
        rel = np.linalg.norm(fd - grads[name]) / scale
        assert rel < 1e-6, f"{name}: relative error {rel:.2e}"
    # b_K adds the same number to every score of a row, which the softmax ignores: its gradient is
    # exactly zero, and no other parameter's is
    assert vanishing == [name for name in params if name.endswith("b_K")]          # attn.b_K and cross.b_K


def _torch_loss(params, cfg, tgt_in, tgt_out, src):
    """The same model in PyTorch, from the formulas (autograd does the backward pass)."""
    import torch

    target = target_stack(cfg)
    H, eps = target.n_heads, target.ln_eps
    p = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}

    def mha(x_q, x_kv, pre, mask=None):
        B, Tq, d = x_q.shape
        Tk, dk = x_kv.shape[1], d // H
        def heads(y, T):
            return y.reshape(B, T, H, dk).transpose(1, 2)                       # (B, H, T, d_k)
        Q = heads(x_q @ p[pre + "W_Q"] + p[pre + "b_Q"], Tq)
        K = heads(x_kv @ p[pre + "W_K"] + p[pre + "b_K"], Tk)
        V = heads(x_kv @ p[pre + "W_V"] + p[pre + "b_V"], Tk)
        s = Q @ K.transpose(-1, -2) / dk ** 0.5
        if mask is not None:
            s = s + mask
        z = torch.softmax(s, dim=-1) @ V
        return z.transpose(1, 2).reshape(B, Tq, d) @ p[pre + "W_O"] + p[pre + "b_O"]

    def ln(x, pre):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], p[pre + ".g"], p[pre + ".b"], eps)

    def ffn(x, pre):
        return torch.relu(x @ p[pre + "ffn.W_1"] + p[pre + "ffn.b_1"]) @ p[pre + "ffn.W_2"] + p[pre + "ffn.b_2"]

    def embed(tokens, prefix):
        T = tokens.shape[1]
        pe = torch.tensor(reference.sinusoidal(T, target.d_model))
        return p[prefix + "embed"][torch.tensor(tokens)] + pe

    memory, stack = None, ""
    if _seq2seq(cfg):
        m = embed(src, "enc.")
        for i in range(cfg.encoder.n_layers):
            pre = f"enc.blocks.{i}."
            m = ln(m + mha(m, m, pre + "attn."), pre + "ln1")
            m = ln(m + ffn(m, pre), pre + "ln2")
        memory, stack = m, "dec."
    x = embed(tgt_in, stack)
    T = tgt_in.shape[1]
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), diagonal=1)
    for i in range(target.n_layers):
        pre = f"{stack}blocks.{i}."
        x = ln(x + mha(x, x, pre + "attn.", causal), pre + "ln1")
        if memory is not None:
            x = ln(x + mha(x, memory, pre + "cross."), pre + "ln_cross")
        x = ln(x + ffn(x, pre), pre + "ln2")
    logits = x @ p["unembed"] + p["unembed_b"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, target.vocab_size), torch.tensor(tgt_out).reshape(-1))
    loss.backward()
    return loss.item(), {name: t.grad.numpy() for name, t in p.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_loss_and_gradients_match_pytorch_autograd(kind):
    require("torch")
    cfg = DecoderConfig(**{**KINDS[kind], "d_model": 8, "n_heads": 4, "d_ff": 12, "tgt_len": 6, "vocab_size": 9},
                        positional="sinusoidal")
    params = _perturbed_params(cfg, seed=3)
    src, tgt_in, tgt_out = _batch(cfg, B=4, seed=4)
    loss, grads = D.loss_and_grads(params, cfg, tgt_in, tgt_out, src)
    torch_loss, torch_grads = _torch_loss(params, cfg, tgt_in, tgt_out, src)
    assert loss == pytest.approx(torch_loss, rel=1e-12)
    for name in params:
        np.testing.assert_allclose(grads[name], torch_grads[name], rtol=1e-8, atol=1e-12, err_msg=name)


def test_float32_gradients_follow_float64():
    cfg = DecoderConfig(**ENC_DEC)
    params64 = _perturbed_params(cfg)
    params32 = {name: value.astype(np.float32) for name, value in params64.items()}
    src, tgt_in, tgt_out = _batch(cfg)
    loss64, g64 = D.loss_and_grads(params64, cfg, tgt_in, tgt_out, src)
    loss32, g32 = D.loss_and_grads(params32, cfg, tgt_in, tgt_out, src)
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for name in params64:
        assert g32[name].dtype == np.float32
        np.testing.assert_allclose(g32[name], g64[name], rtol=1e-3, atol=1e-5, err_msg=name)


# ----------------------------------------------------------------------------------------------
# forward: the causal mask and the cache
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_position_never_sees_the_future(kind):
    cfg = DecoderConfig(**KINDS[kind])
    params = _perturbed_params(cfg)
    src, tgt_in, _ = _batch(cfg)
    target = target_stack(cfg)
    logits, cache = D.forward(params, cfg, tgt_in, src)
    for t in range(target.n_ctx - 1):
        changed = tgt_in.copy()
        changed[:, t + 1:] = (changed[:, t + 1:] + 1) % target.vocab_size       # rewrite every later token
        later, _ = D.forward(params, cfg, changed, src)
        np.testing.assert_array_equal(later[:, :t + 1], logits[:, :t + 1])
        assert not np.allclose(later[:, t + 1:], logits[:, t + 1:])
    A = attention_weights(cache, cfg)
    T = target.n_ctx
    assert A.shape == (target.n_layers, 3, target.n_heads, T, T)
    assert (A[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-12)


def test_the_cache_holds_every_attention_map():
    cfg = DecoderConfig(**ENC_DEC)
    params = _perturbed_params(cfg)
    src, tgt_in, _ = _batch(cfg, B=2)
    logits, cache = D.forward(params, cfg, tgt_in, src)
    L, H, S, T, d = cfg.decoder.n_layers, cfg.decoder.n_heads, cfg.encoder.n_ctx, cfg.decoder.n_ctx, cfg.decoder.d_model
    assert logits.shape == (2, T, cfg.decoder.vocab_size)
    enc = np.stack([cache[f"enc.blocks.{i}.attn.weights"] for i in range(L)])
    cross = attention_weights(cache, cfg, "cross")
    assert enc.shape == (L, 2, H, S, S) and cross.shape == (L, 2, H, T, S)
    assert cache["memory"].shape == (2, S, d) and cache["dec.final"].shape == (2, T, d)
    for weights in (enc, cross):
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)
    # the cross-attention of layer 0 is softmax((x1 W_Q + b_Q)(m W_K + b_K)^T / sqrt(d_k)), from the cached
    # x1 (post-norm: the residual stream after the self-attention's LayerNorm) and m
    p = {n: params[f"dec.blocks.0.cross.{n}"] for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")}
    x1 = cache["dec.blocks.0.resid_mid"]
    expected = reference.multi_head_attention(x1, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], H, X_kv=cache["memory"],
                                              b_Q=p["b_Q"], b_K=p["b_K"], b_V=p["b_V"], b_O=p["b_O"])
    np.testing.assert_allclose(cross[0], expected["weights"], rtol=1e-12)
    # one sequence in: the logits lose the batch axis, the cache keeps it (B = 1); the numbers are the same
    one, one_cache = D.forward(params, cfg, tgt_in[1], src[1])
    np.testing.assert_allclose(one, logits[1], rtol=1e-13)
    np.testing.assert_allclose(attention_weights(one_cache, cfg, "cross")[:, 0], cross[:, 1], rtol=1e-12)


def test_decoder_only_has_no_encoder():
    cfg = DecoderConfig(**DEC_ONLY)
    params = D.init_params(cfg)
    assert not any(name.startswith("enc.") or "cross" in name for name in params)
    _, cache = D.forward(params, cfg, [[1, 2, 3]])
    assert not any(".cross." in name or name.startswith("enc.") for name in cache) and "memory" not in cache


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_is_the_matrix_product(dtype):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 5, 7)).astype(dtype), rng.standard_normal((2, 3, 7, 4)).astype(dtype)
    got = layers.matmul(a, b.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2))   # a strided view too
    np.testing.assert_allclose(got, a @ b, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert got.dtype == dtype
    w = rng.standard_normal((7, 3)).astype(dtype)
    np.testing.assert_allclose(layers.matmul(a, w), a @ w, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_gradients_are_the_same_bits_whatever_other_threads_do():
    """Sessions share one process: NumPy work in another thread must not change a seed's numbers."""
    import threading

    pytest.importorskip("threadpoolctl")

    # big enough products (4096 x 64 by 64 x 64) that a BLAS would split them over its threads
    cfg = presets.decoder_lm(vocab_size=9, n_ctx=16, d_model=64, n_heads=4, d_ff=64, n_layers=1)
    params = D.init_params(cfg, seed=3)
    tokens = np.random.default_rng(1).integers(0, 9, (256, 17))
    alone = D.loss_and_grads(params, cfg, tokens[:, :-1], tokens[:, 1:])[1]
    stop = threading.Event()

    def numpy_work():           # another session's matrix products, changing BLAS's thread count
        from threadpoolctl import threadpool_limits

        x = np.random.default_rng(2).standard_normal((400, 400))
        while not stop.is_set():
            for threads in (1, 2):
                with threadpool_limits(threads, user_api="blas"):
                    x = np.tanh(x @ x)

    worker = threading.Thread(target=numpy_work)
    worker.start()
    try:
        beside = [D.loss_and_grads(params, cfg, tokens[:, :-1], tokens[:, 1:])[1] for _ in range(3)]
    finally:
        stop.set()
        worker.join()
    for grads in beside:
        assert all(np.array_equal(alone[k], grads[k]) for k in alone)


def test_the_public_name():
    from core import decoder

    assert decoder is D


def test_init_params_is_deterministic_per_seed_and_dtype():
    cfg = DecoderConfig(**ENC_DEC)
    a, b, c = D.init_params(cfg, seed=4), D.init_params(cfg, seed=4), D.init_params(cfg, seed=5)
    assert all(np.array_equal(a[n], b[n]) for n in a) and not np.array_equal(a["unembed"], c["unembed"])
    p64 = D.init_params(cfg, seed=4, dtype=np.float64)
    assert all(p64[n].dtype == np.float64 and a[n].dtype == np.float32 for n in a)
    np.testing.assert_allclose(a["unembed"], p64["unembed"], rtol=1e-6)
    assert D.param_count(cfg) == sum(v.size for v in a.values())


# ----------------------------------------------------------------------------------------------
# generation: with and without the KV cache
# ----------------------------------------------------------------------------------------------
def _gen_cfg(kind):
    sizes = dict(vocab_size=11, n_ctx=9, d_model=16, n_heads=4, d_ff=24, n_layers=2)
    if kind == "encoder-decoder":
        return presets.seq2seq(**sizes, src_vocab_size=10, src_len=7, bos_id=10)
    return presets.decoder_lm(**sizes)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sampler", [dict(temperature=0.0), dict(temperature=1.3, top_k=5, top_p=0.9)])
def test_cached_generation_gives_the_logits_of_the_full_recompute(kind, dtype, tol, sampler):
    cfg = _gen_cfg(kind)
    params = D.init_params(cfg, seed=6, dtype=dtype)
    rng = np.random.default_rng(8)
    src = rng.integers(0, 10, (3, 7)) if kind == "encoder-decoder" else None
    prompt = [[10, 3], [10, 4], [10, 5]]
    cached = D.generate(params, cfg, src, prompt=prompt, max_new_tokens=8, use_cache=True, seed=11, **sampler)
    full = D.generate(params, cfg, src, prompt=prompt, max_new_tokens=8, use_cache=False, seed=11, **sampler)
    np.testing.assert_allclose(cached.step_logits, full.step_logits, rtol=tol, atol=tol)
    np.testing.assert_array_equal(cached.tokens, full.tokens)
    for a, b in zip(cached.self_attn, full.self_attn):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    if kind == "encoder-decoder":
        np.testing.assert_allclose(cached.cross_attn, full.cross_attn, rtol=tol, atol=tol)
    # the last step's logits are those of teacher forcing on the whole generated sequence
    logits, _ = D.forward(params, cfg, cached.tokens[:, :-1], src)
    np.testing.assert_allclose(cached.step_logits, logits[:, 1:], rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", KINDS)
def test_the_kv_cache_grows_one_row_per_step_and_holds_the_keys_and_values(kind):
    cfg = _gen_cfg(kind)
    params = D.init_params(cfg, seed=6, dtype=np.float64)
    src = np.arange(7) % 10 if kind == "encoder-decoder" else None
    gen = D.generate(params, cfg, src, prompt=[10, 1, 2], max_new_tokens=7, seed=3)
    assert gen.tokens.shape == (10,) and gen.prompt_len == 3 and gen.new_tokens.shape == (7,)
    np.testing.assert_array_equal(gen.cache_sizes, np.arange(3, 10))
    np.testing.assert_array_equal(gen.positions_computed, [3, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal([row.shape[-1] for row in gen.self_attn], np.arange(3, 10))
    full = D.generate(params, cfg, src, prompt=[10, 1, 2], max_new_tokens=7, seed=3, use_cache=False)
    np.testing.assert_array_equal(full.positions_computed, np.arange(3, 10))
    assert full.keys is None and (full.cache_sizes == 0).all()
    # the cache's rows are the keys and values the teacher-forced pass computes for the same tokens
    _, cache = D.forward(params, cfg, gen.tokens[:-1], src)
    target = target_stack(cfg)
    assert gen.keys.shape == (target.n_layers, target.n_heads, 9, target.d_k)
    stack = "dec." if _seq2seq(cfg) else ""
    for layer in range(target.n_layers):
        x = cache[f"{stack}blocks.{layer}.resid_pre"][0]              # (T, d): the self-attention's input
        for name, got in (("K", gen.keys[layer]), ("V", gen.values[layer])):
            block = f"{stack}blocks.{layer}.attn."
            w, b = params[f"{block}W_{name}"], params[f"{block}b_{name}"]
            want = (x @ w + b).reshape(9, target.n_heads, target.d_k).transpose(1, 0, 2)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=name)
    # each step's row is a causal distribution over the positions read so far
    for row in gen.self_attn:
        np.testing.assert_allclose(row.sum(-1), 1.0, rtol=1e-12)


def test_same_seed_same_samples_and_greedy_ignores_the_seed():
    cfg = _gen_cfg("decoder-only")
    params = D.init_params(cfg, seed=2)
    def run(**kw):
        return D.generate(params, cfg, prompt=[[1], [2], [3], [4]], max_new_tokens=8, temperature=2.0, **kw).tokens
    np.testing.assert_array_equal(run(seed=5), run(seed=5))
    assert not np.array_equal(run(seed=5), run(seed=6))
    greedy = [D.generate(params, cfg, prompt=[1], max_new_tokens=8, temperature=0, seed=s).tokens for s in (0, 1)]
    np.testing.assert_array_equal(*greedy)
    logits = D.generate(params, cfg, prompt=[1], max_new_tokens=8, temperature=0).step_logits
    np.testing.assert_array_equal(greedy[0][1:], logits.argmax(axis=-1))


def test_generation_reports_what_the_sampler_allowed():
    cfg = _gen_cfg("decoder-only")
    params = D.init_params(cfg, seed=2, dtype=np.float64)
    gen = D.generate(params, cfg, prompt=[1], max_new_tokens=6, temperature=0.7, top_k=3, seed=1)
    assert (gen.allowed.sum(-1) == 3).all()
    assert gen.allowed[np.arange(6), gen.new_tokens].all()
    np.testing.assert_allclose(gen.step_probs.sum(-1), 1.0)
    assert (gen.step_probs[~gen.allowed] == 0).all()


# ----------------------------------------------------------------------------------------------
# bad input: clear messages
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=10, n_heads=4), "cannot be split evenly into 4 heads"),
    (dict(vocab_size=0), "vocab_size must be a positive whole number"),
    (dict(tgt_len=2.5), "n_ctx must be a positive whole number"),
    (dict(src_len=None), "needs src_vocab_size and src_len"),
    (dict(src_vocab_size=0), "vocab_size must be a positive whole number"),
    (dict(positional="rope"), "positional must be one of"),
    (dict(bos_id=11), "bos_id must be a token id in 0..10"),
    (dict(ln_eps=0.0), "ln_eps must be a small positive number"),
])
def test_bad_configs_are_refused(kwargs, message):
    base = dict(vocab_size=11, tgt_len=8, src_vocab_size=10, src_len=8)
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**{**base, **kwargs})
    with pytest.raises(ValueError, match="has no source"):
        DecoderConfig(vocab_size=5, tgt_len=4, cross_attention=False, src_len=3)


def test_the_constructor_gives_the_presets():
    """decoder.DecoderConfig, the design's constructor, is the matching preset (tgt_len is n_ctx)."""
    assert DecoderConfig(11, 8, src_vocab_size=10, src_len=6, bos_id=10) == presets.seq2seq(11, 8, 10, 6, bos_id=10)
    assert DecoderConfig(11, 8, d_ff=0, cross_attention=False, positional="learned") == presets.attention_only(
        11, 8, positional="learned")


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=[]), "The prompt is empty"),
    (dict(prompt=[1, 11]), "outside the vocabulary 0..10"),
    (dict(prompt=[-1]), "outside the vocabulary"),
    (dict(prompt=list(range(10))), "longer than the model's context of 9"),
    (dict(prompt=[1, 2, 3], max_new_tokens=8), "needs a context of 10 positions.*at most 7 new tokens"),
    (dict(prompt=[1.5]), "whole-number token ids"),
    (dict(max_new_tokens=0), "max_new_tokens must be a whole number >= 1"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.01), r"top_p must be in \(0, 1\]"),
    (dict(top_k=0), "top_k must be a whole number >= 1"),
    (dict(temperature=-1.0), "temperature must be a number >= 0"),
])
def test_bad_generation_requests_are_refused(kwargs, message):
    cfg = _gen_cfg("decoder-only")
    params = D.init_params(cfg)
    request = {"prompt": [1], "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        D.generate(params, cfg, **request)


def test_missing_or_unexpected_source_and_missing_start_token():
    lm = _gen_cfg("decoder-only")
    with pytest.raises(ValueError, match="no start token"):
        D.generate(D.init_params(lm), lm, max_new_tokens=2)
    with pytest.raises(ValueError, match="takes no source"):
        D.generate(D.init_params(lm), lm, [1, 2], prompt=[1], max_new_tokens=2)
    seq2seq = _gen_cfg("encoder-decoder")
    params = D.init_params(seq2seq)
    with pytest.raises(ValueError, match="needs a source"):
        D.generate(params, seq2seq, max_new_tokens=2)
    with pytest.raises(ValueError, match="The source holds the id 10"):
        D.generate(params, seq2seq, [1, 10], max_new_tokens=2)
    # with bos_id, no prompt is needed
    assert D.generate(params, seq2seq, [1, 2], max_new_tokens=2).tokens[0] == seq2seq.bos_id


def test_bad_forward_inputs_are_refused():
    cfg = DecoderConfig(**ENC_DEC)
    params = D.init_params(cfg)
    src, tgt_in, tgt_out = _batch(cfg)
    with pytest.raises(ValueError, match="longer than the model's context of 4"):
        D.forward(params, cfg, np.zeros((3, 5), dtype=int), src)
    with pytest.raises(ValueError, match="needs a source"):
        D.forward(params, cfg, tgt_in)
    with pytest.raises(ValueError, match="must match tgt_in"):
        D.loss_and_grads(params, cfg, tgt_in, tgt_out[:, :2], src)
    with pytest.raises(ValueError, match="has shape"):
        D.forward({**params, "unembed": np.zeros((3, 3), np.float32)}, cfg, tgt_in, src)
    with pytest.raises(ValueError, match="lacks"):
        D.forward({k: v for k, v in params.items() if k != "unembed_b"}, cfg, tgt_in, src)


# ----------------------------------------------------------------------------------------------
# tasks
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_sequence_tasks_are_teacher_forcing_ready(task):
    ds = tasks.make_sequence_dataset(task, n_train=300, n_val=50, seed=3)
    assert ds.src_train.shape == ds.tgt_in_train.shape == ds.tgt_out_train.shape == (300, 8)
    expected = ds.src_val[:, ::-1] if task == "reverse" else np.sort(ds.src_val, axis=1)
    np.testing.assert_array_equal(ds.tgt_out_val, expected)
    assert (ds.tgt_in_train[:, 0] == ds.bos_id).all()
    np.testing.assert_array_equal(ds.tgt_in_train[:, 1:], ds.tgt_out_train[:, :-1])      # shifted right
    rows = {row.tobytes() for row in np.concatenate([ds.src_train, ds.src_val])}
    assert len(rows) == 350                                                               # no string twice
    again = tasks.make_sequence_dataset(task, n_train=300, n_val=50, seed=3)
    np.testing.assert_array_equal(again.src_val, ds.src_val)
    assert tasks.digits_text(ds.tgt_in_val[0])[0] == "^"
    with pytest.raises(ValueError, match="Unknown sequence task"):
        tasks.make_sequence_dataset("copy")


def test_char_corpus_windows_and_vocabulary():
    corpus = tasks.make_char_corpus(context=16)
    text = tasks.corpus_text()
    assert corpus.vocab.decode(corpus.vocab.encode(text)) == text
    np.testing.assert_array_equal(corpus.X_train[:, 1:], corpus.Y_train[:, :-1])
    assert corpus.vocab.decode(corpus.X_val[0]) == text[len(corpus.train_ids):][:16]
    assert len(corpus.train_ids) + len(corpus.val_ids) == len(text)
    with pytest.raises(ValueError, match="Unknown character"):
        corpus.vocab.encode("attention?")


# ----------------------------------------------------------------------------------------------
# results, with a fixed seed
# ----------------------------------------------------------------------------------------------
def test_reverse_reaches_95_percent_exact_match_quickly():
    ds = tasks.make_sequence_dataset("reverse", n_train=4000, n_val=500, seed=0)
    cfg = presets.seq2seq(ds.vocab_size, ds.seq_len, ds.src_vocab_size, ds.seq_len, bos_id=ds.bos_id)
    params = D.init_params(cfg, seed=0)
    decoder_loss.warm_up()                  # the first compile of the step is not training time
    wall, cpu = time.perf_counter(), time.process_time()
    decoder_runs.train(params, cfg, ds.tgt_in_train, ds.tgt_out_train, ds.src_train, steps=400, batch_size=64, lr=3e-3)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    accuracy = D.greedy_exact_match(params, cfg, ds.src_val, ds.tgt_out_val)
    print(f"reverse: exact match {accuracy:.3f} after 400 steps, {wall:.1f} s wall, {cpu:.1f} s CPU")
    assert accuracy >= 0.95
    assert cpu < 30.0           # CPU time: the wall clock also counts whatever else shares the machine
    # cross-attention learned the anti-diagonal: output position t reads source position T-1-t
    _, cache = D.forward(params, cfg, ds.tgt_in_val[:50], ds.src_val[:50])
    reads = attention_weights(cache, cfg, "cross").mean(axis=(1, 2)).argmax(axis=-1)          # (L, T): where each layer looks
    assert any((row == np.arange(8)[::-1]).all() for row in reads)


def test_on_params_sees_the_parameters_of_each_checkpoint():
    cfg = DecoderConfig(**ENC_DEC)
    src, tgt_in, tgt_out = _batch(cfg, B=6)
    seen = {}

    def keep(step, params):
        seen[step] = {name: value.copy() for name, value in params.items()}

    decoder_runs.train(D.init_params(cfg, seed=0), cfg, tgt_in, tgt_out, src, steps=5, batch_size=4, every=2, on_params=keep)
    assert sorted(seen) == [2, 4]                          # not after the last step: the caller has those
    stopped = D.init_params(cfg, seed=0)                   # the same run, stopped after its fourth step
    decoder_runs.train(stopped, cfg, tgt_in, tgt_out, src, steps=5, batch_size=4, callback=lambda step, loss: step == 3)
    for name, value in stopped.items():
        np.testing.assert_array_equal(seen[4][name], value, err_msg=name)


def test_language_model_beats_the_unigram_baseline():
    corpus = tasks.make_char_corpus(context=32)
    cfg = presets.decoder_lm(corpus.vocab.size, 32)
    params = D.init_params(cfg, seed=0)
    before = D.mean_loss(params, cfg, corpus.X_val, corpus.Y_val)
    decoder_runs.train(params, cfg, corpus.X_train, corpus.Y_train, steps=200, batch_size=32, lr=3e-3)
    after = D.mean_loss(params, cfg, corpus.X_val, corpus.Y_val)
    baseline = tasks.unigram_loss(corpus)
    print(f"language model: validation loss {before:.3f} -> {after:.3f} nats/char, unigram {baseline:.3f}")
    assert after < baseline < before
