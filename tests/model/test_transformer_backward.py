"""The readable backward pass of the one transformer, for every kind of model the app trains:
against central differences in float64, and against PyTorch's autograd on the same model written
functionally in torch from our parameters."""
import math

import numpy as np
import pytest

from core.model import layers as L
from core.model import transformer as tr
from core.model import config as C
from core.model import transformer_backward as tb
from oracle_support import require

BASE = dict(vocab_size=11, n_ctx=7, d_model=8, n_heads=2, d_ff=12, n_layers=2)
KINDS = {
    "encoder-classifier": dict(causal=False, head="classify", n_classes=3),        # the seeds: post, relu, sinusoidal
    "gpt2": dict(norm_placement="pre", activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True),
    "decoder": dict(unembed_b=True),                                               # post-norm, causal, b_out
    "no-bias": dict(bias=False, norm_placement="pre", activation="gelu_tanh", final_ln=True),
    "attention-only": dict(d_ff=0, unembed_b=True),
    "attention-only-pre": dict(d_ff=0, norm_placement="pre", positional="learned", final_ln=True),
    "no-positions": dict(positional="none", activation="gelu_tanh"),
    "classifier-pre-learned": dict(norm_placement="pre", positional="learned", final_ln=True, head="classify", n_classes=4,
                                   bias=False),
    "rmsnorm-pre-gelu-erf": dict(norm="rmsnorm", norm_placement="pre", activation="gelu_erf", positional="learned",
                                 tied_unembed=True, final_ln=True),
    "rmsnorm-post": dict(norm="rmsnorm", unembed_b=True),
    # the Llama family: SwiGLU, rotary positions, two query heads reading one key/value head
    "llama": dict(norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary",
                  rope_base=50.0, tied_unembed=True, final_ln=True, bias=False, n_kv_heads=1),
    "gated-gelu-rotary-gqa-biases": dict(activation="gelu_tanh", gated_ffn=True, positional="rotary", n_kv_heads=1,
                                         unembed_b=True),
    "silu-gqa": dict(activation="silu", n_kv_heads=1, norm_placement="pre", final_ln=True, positional="learned"),
}


def model(kind: str, dtype=np.float64, seed: int = 0):
    """A tiny model of that kind with every parameter random (LayerNorm gains near 1), a batch and its targets."""
    cfg = C.TransformerConfig(**{**BASE, **KINDS[kind]})
    rng = np.random.default_rng(seed)
    params = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)
              for n, v in C.init_params(cfg, seed, np.float64).items()}
    tokens = rng.integers(0, cfg.vocab_size, (2, 5))
    targets = rng.integers(0, cfg.n_classes, 2) if cfg.head == "classify" else rng.integers(0, cfg.vocab_size, (2, 5))
    return cfg, params, tokens, targets


def forward_loss(params, cfg, tokens, targets) -> float:
    """The loss from the forward pass alone (what the differences differentiate)."""
    return float(L.cross_entropy(tr.forward(params, cfg, tokens)[0], targets)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_matches_central_differences(kind):
    """Every entry of every parameter: central differences of the forward pass's loss, in float64,
    to 1e-6 of the gradient's largest entry."""
    cfg, params, tokens, targets = model(kind)
    loss, grads = tb.loss_and_grads(params, cfg, tokens, targets)
    assert loss == pytest.approx(forward_loss(params, cfg, tokens, targets), rel=1e-14)
    assert grads.keys() == params.keys()
    eps = 1e-5
    numeric = {}
    for name, value in params.items():
        numeric[name] = np.empty_like(value)
        for idx in np.ndindex(value.shape):
            bumped = dict(params, **{name: value.copy()})
            bumped[name][idx] += eps
            up = forward_loss(bumped, cfg, tokens, targets)
            bumped[name][idx] -= 2 * eps
            numeric[name][idx] = (up - forward_loss(bumped, cfg, tokens, targets)) / (2 * eps)
    scale = max(np.abs(g).max() for g in numeric.values())
    for name in params:
        assert grads[name].shape == params[name].shape and grads[name].dtype == params[name].dtype
        np.testing.assert_allclose(grads[name], numeric[name], rtol=0, atol=1e-6 * scale, err_msg=name)


# ----------------------------------------------------------------------------------------------
# PyTorch's autograd on the same model, written functionally from the formulas
# ----------------------------------------------------------------------------------------------
def torch_stack(torch, tp: dict, cfg: C.TransformerConfig, tokens, prefix: str = "", memory=None):
    """One stack in torch, from its parameters ``tp`` (torch tensors) and the formulas: its last hidden
    states (B, T, d); with ``memory``, each block attends over it after its self-attention."""
    F = torch.nn.functional
    d, H = cfg.d_model, cfg.n_heads
    d_k = d // H
    tokens = torch.from_numpy(tokens)
    B, T = tokens.shape

    def lin(x, prefix, w):
        bias = tp.get(f"{prefix}b_{w[2:]}")
        return x @ tp[prefix + w] + (bias if bias is not None else 0)

    def ln(x, name):
        return norm(F, tp, cfg, x, name)

    def heads(x):                                                              # (B, H or H_kv, T, d_k)
        return x.view(B, x.shape[1], x.shape[2] // d_k, d_k).transpose(1, 2)

    def rotated(x):                                                           # rotate-half, positions 0..T-1
        inv_freq = cfg.rope_base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
        angles = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * inv_freq
        cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
        return x * cos + torch.cat([-x[..., d_k // 2:], x[..., :d_k // 2]], -1) * sin

    def mha(x, kv, prefix, causal):
        q, k, v = heads(lin(x, prefix, "W_Q")), heads(lin(kv, prefix, "W_K")), heads(lin(kv, prefix, "W_V"))
        if cfg.positional == "rotary" and kv is x:
            q, k = rotated(q), rotated(k)
        k, v = k.repeat_interleave(H // k.shape[1], dim=1), v.repeat_interleave(H // v.shape[1], dim=1)   # GQA
        s = q @ k.transpose(-1, -2) / math.sqrt(d_k)
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        z = torch.softmax(s, dim=-1) @ v                                      # (B, H, T, d_k)
        return lin(z.transpose(1, 2).reshape(B, T, d), prefix, "W_O")

    def ffn(x, prefix):
        pre = lin(x, prefix, "W_1")
        act = {"gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "gelu_erf": F.gelu, "relu": torch.relu,
               "silu": F.silu}[cfg.activation]
        hidden = act(lin(x, prefix, "W_gate")) * pre if cfg.gated_ffn else act(pre)
        return lin(hidden, prefix, "W_2")

    h = tp[prefix + "embed"][tokens]
    if cfg.positional == "learned":
        h = h + tp[prefix + "pos"][:T]
    elif cfg.positional == "sinusoidal":                                      # PE(t, 2i) = sin(t / 10000^(2i/d)), cos for 2i+1
        t = torch.arange(T, dtype=h.dtype)[:, None]
        angle = t / torch.pow(torch.tensor(10000.0, dtype=h.dtype), torch.arange(0, d, 2, dtype=h.dtype) / d)
        pe = torch.zeros(T, d, dtype=h.dtype)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
        h = h + pe
    for i in range(cfg.n_layers):
        b = f"{prefix}blocks.{i}."
        if cfg.norm_placement == "pre":
            a = ln(h, b + "ln1")
            h = h + mha(a, a, b + "attn.", cfg.causal)
            h = h + mha(ln(h, b + "ln_cross"), memory, b + "cross.", False) if memory is not None else h
            h = h + ffn(ln(h, b + "ln2"), b + "ffn.") if cfg.d_ff else h
        else:
            h = ln(h + mha(h, h, b + "attn.", cfg.causal), b + "ln1")
            h = ln(h + mha(h, memory, b + "cross.", False), b + "ln_cross") if memory is not None else h
            h = ln(h + ffn(h, b + "ffn."), b + "ln2") if cfg.d_ff else h
    return h


def norm(F, tp: dict, cfg: C.TransformerConfig, x, name: str):
    """The model's norm ``name`` (its parameters ``{name}.g``, ``{name}.b``) in torch: LayerNorm or RMSNorm."""
    if cfg.norm == "rmsnorm":
        return F.rms_norm(x, (cfg.d_model,), tp[f"{name}.g"], cfg.ln_eps)
    return F.layer_norm(x, (cfg.d_model,), tp[f"{name}.g"], tp[f"{name}.b"], cfg.ln_eps)


def torch_head_loss(torch, tp: dict, cfg: C.TransformerConfig, h, targets):
    """The final norm, the head and the mean cross-entropy, in torch."""
    F = torch.nn.functional
    targets = torch.from_numpy(targets)
    if cfg.final_ln:
        h = norm(F, tp, cfg, h, "ln_final")
    if cfg.head == "classify":
        return F.cross_entropy(h.mean(dim=1) @ tp["classifier.W"] + tp["classifier.b"], targets)
    logits = h @ (tp["embed"].T if cfg.tied_unembed else tp["unembed"])
    if cfg.unembed_b:
        logits = logits + tp["unembed_b"]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_loss(torch, tp: dict, cfg: C.TransformerConfig, tokens, targets):
    return torch_head_loss(torch, tp, cfg, torch_stack(torch, tp, cfg, tokens), targets)


def assert_matches_autograd(loss, grads, ref, tp, dtype):
    """Our loss and gradients against PyTorch's loss ``ref`` and, after its backward, the gradients
    of the leaf tensors ``tp``: 1e-12 in float64, 2e-5 in float32 (of the largest gradient)."""
    ref.backward()
    tol = 1e-12 if dtype == np.float64 else 2e-5
    assert loss == pytest.approx(ref.item(), rel=tol)
    scale = max(t.grad.abs().max().item() for t in tp.values())
    for name, t in tp.items():
        np.testing.assert_allclose(grads[name], t.grad.numpy(), rtol=tol, atol=tol * scale, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_gradient_matches_pytorch_autograd(kind, dtype):
    torch = require("torch")
    cfg, params, tokens, targets = model(kind, dtype, seed=1)
    loss, grads = tb.loss_and_grads(params, cfg, tokens, targets)
    tp = {n: torch.from_numpy(v.copy()).requires_grad_(True) for n, v in params.items()}
    ref = torch_loss(torch, tp, cfg, tokens, targets)
    assert_matches_autograd(loss, grads, ref, tp, dtype)


def test_bad_targets_and_gradients_are_refused():
    cfg, params, tokens, targets = model("encoder-classifier")
    for bad in (targets[:1], targets.astype(float), np.array([0, 3]), np.zeros((2, 5), int)):
        with pytest.raises(ValueError, match="targets"):
            tb.loss_and_grads(params, cfg, tokens, bad)
    lm, lm_params, lm_tokens, lm_targets = model("gpt2")
    for bad in (lm_targets[:, :3], np.full((2, 5), 11), lm_targets[:, 0]):
        with pytest.raises(ValueError, match="targets"):
            tb.loss_and_grads(lm_params, lm, lm_tokens, bad)
    logits, cache = tr.forward(lm_params, lm, lm_tokens)
    with pytest.raises(ValueError, match="d_logits"):
        tb.backward(lm_params, lm, cache, logits[:, :2])
    kv = [{} for _ in range(lm.n_layers)]
    tr.forward(lm_params, lm, lm_tokens[:, :3], kv=kv)
    logits, cache = tr.forward(lm_params, lm, lm_tokens[:, 3:], kv=kv, start=3)
    with pytest.raises(ValueError, match="KV-cached"):
        tb.backward(lm_params, lm, cache, logits)
    logits, cache = tr.forward(lm_params, lm, lm_tokens, ablate={(0, 1): "zero"})
    with pytest.raises(ValueError, match="ablated or patched"):
        tb.backward(lm_params, lm, cache, logits)


# ----------------------------------------------------------------------------------------------
# the encoder-decoder: the same blocks, with cross-attention in the decoder's
# ----------------------------------------------------------------------------------------------
SEQ2SEQ = {
    "original": dict(),                                                           # post-norm, ReLU, sinusoidal
    "pre-gelu-learned-no-bias": dict(norm_placement="pre", activation="gelu_tanh", positional="learned", bias=False),
    "attention-only": dict(d_ff=0, positional="none"),
    "rmsnorm-pre-gelu-erf": dict(norm="rmsnorm", norm_placement="pre", activation="gelu_erf"),
}


def seq2seq_model(kind: str, dtype=np.float64, seed: int = 0):
    from core.model import transformer_encdec as ed

    settings = {**BASE, "n_layers": 2, **SEQ2SEQ[kind]}
    enc = C.TransformerConfig(**{**settings, "vocab_size": 6, "n_ctx": 5, "causal": False})
    dec = C.TransformerConfig(**settings, unembed_b=True, final_ln=settings.get("norm_placement") == "pre")
    cfg = ed.EncoderDecoderConfig(enc, dec)
    rng = np.random.default_rng(seed)
    params = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)
              for n, v in ed.init_params(cfg, seed, np.float64).items()}
    src = rng.integers(0, 6, (2, 4))
    tgt_in, tgt_out = rng.integers(0, cfg.decoder.vocab_size, (2, 5)), rng.integers(0, cfg.decoder.vocab_size, (2, 5))
    return ed, cfg, params, (src, tgt_in, tgt_out)


@pytest.mark.parametrize("kind", SEQ2SEQ)
def test_encoder_decoder_gradient_matches_central_differences(kind):
    ed, cfg, params, (src, tgt_in, tgt_out) = seq2seq_model(kind)
    loss, grads = ed.loss_and_grads(params, cfg, src, tgt_in, tgt_out)
    assert grads.keys() == params.keys()
    assert any(".cross." in n for n in grads) and any(n.startswith("enc.blocks.") for n in grads)

    def f(p):
        return float(L.cross_entropy(ed.forward(p, cfg, src, tgt_in)[0], tgt_out)[0])

    assert loss == pytest.approx(f(params), rel=1e-14)
    eps, numeric = 1e-5, {}
    for name, value in params.items():
        numeric[name] = np.empty_like(value)
        for idx in np.ndindex(value.shape):
            bumped = dict(params, **{name: value.copy()})
            bumped[name][idx] += eps
            up = f(bumped)
            bumped[name][idx] -= 2 * eps
            numeric[name][idx] = (up - f(bumped)) / (2 * eps)
    scale = max(np.abs(g).max() for g in numeric.values())
    for name in params:
        np.testing.assert_allclose(grads[name], numeric[name], rtol=0, atol=1e-6 * scale, err_msg=name)


@pytest.mark.parametrize("kind", SEQ2SEQ)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_encoder_decoder_gradient_matches_pytorch_autograd(kind, dtype):
    torch = require("torch")
    ed, cfg, params, (src, tgt_in, tgt_out) = seq2seq_model(kind, dtype, seed=1)
    loss, grads = ed.loss_and_grads(params, cfg, src, tgt_in, tgt_out)
    tp = {n: torch.from_numpy(v.copy()).requires_grad_(True) for n, v in params.items()}
    memory = torch_stack(torch, tp, cfg.encoder, src, "enc.")
    ref = torch_head_loss(torch, tp, cfg.decoder, torch_stack(torch, tp, cfg.decoder, tgt_in, "dec.", memory), tgt_out)
    assert_matches_autograd(loss, grads, ref, tp, dtype)


def test_a_tiny_llama_learns_to_count_on():
    """SwiGLU, rotary positions and two query heads over one key/value head, trained by the readable
    backward pass and Adam: the next token is the previous one plus one (mod 11), and the loss falls
    from log 11 = 2.4 to near 0."""
    from core.model import params as P
    from core.model.optim import Adam

    cfg = C.TransformerConfig(**{**BASE, **KINDS["llama"], "n_ctx": 8})
    flat, params = P.pack(C.init_params(cfg, seed=0, dtype=np.float64))
    opt, rng = Adam(flat.size, np.float64, lr=1e-2), np.random.default_rng(0)
    losses = []
    for _ in range(150):
        start = rng.integers(0, cfg.vocab_size, (8, 1))
        seq = (start + np.arange(cfg.n_ctx + 1)) % cfg.vocab_size                       # (8, 9)
        loss, grads = tb.loss_and_grads(params, cfg, seq[:, :-1], seq[:, 1:])
        opt.step(flat, np.concatenate([grads[n].reshape(-1) for n in params]))
        losses.append(loss)
    assert losses[0] > 2.0 and max(losses[-10:]) < 0.05
