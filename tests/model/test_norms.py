"""The norm kinds (LayerNorm, RMSNorm) and the residual wiring around a sublayer (pre- and post-norm):
each forward against its formula (RMSNorm also against torch's), each backward against central
differences, and the parameters each kind gives a model."""
import numpy as np
import pytest

from core.model import config as C
from core.model import norms as N
from core.model import transformer_encdec as ed
from core.model.tuned import offsets
from oracle_support import require

EPS = 1e-5


def rows(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.3, 1.5, (2, 3, 6))
    w = {"g": rng.normal(1.0, 0.3, 6), "b": rng.normal(0.0, 0.3, 6)}
    return x, w


def test_rms_norm_is_its_formula_and_torchs():
    x, w = rows()
    cache = {}
    y = N.rms_norm(x, w, EPS, cache, "ln")
    rms = np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + EPS)
    np.testing.assert_allclose(y, w["g"] * x / rms, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(cache["ln.rms"], rms[..., 0], rtol=1e-15)
    np.testing.assert_array_equal(cache["ln.input"], x)
    torch = require("torch")
    if hasattr(torch.nn, "RMSNorm"):
        norm = torch.nn.RMSNorm(6, eps=EPS, dtype=torch.float64)
        with torch.no_grad():
            norm.weight.copy_(torch.from_numpy(w["g"]))
            np.testing.assert_allclose(y, norm(torch.from_numpy(x)).numpy(), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kind", list(N.NORMS))
def test_each_norms_backward_is_the_derivative_of_its_forward(kind):
    """Of ``sum(dy * norm(x))``: with respect to every input and every parameter, by central differences."""
    norm = N.NORMS[kind]
    x, w = rows(1)
    w = {p: w[p] for p in norm.params}
    dy = np.random.default_rng(2).normal(size=x.shape)

    def loss(x, w):
        return float((dy * norm.forward(x, w, EPS, {}, "ln")).sum())

    cache = {}
    norm.forward(x, w, EPS, cache, "ln")
    dx, grads = norm.backward(dy, w, cache, "ln")
    assert grads.keys() == w.keys()
    h = 1e-6
    for name, value, got in [("x", x, dx)] + [(p, w[p], grads[p]) for p in w]:
        numeric = np.empty_like(value)
        for idx in np.ndindex(value.shape):
            up, down = value.copy(), value.copy()
            up[idx] += h
            down[idx] -= h
            args = [(up, w), (down, w)] if name == "x" else [(x, {**w, name: up}), (x, {**w, name: down})]
            numeric[idx] = (loss(*args[0]) - loss(*args[1])) / (2 * h)
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8, err_msg=f"{kind}: d{name}")


@pytest.mark.parametrize("placement", list(N.PLACEMENTS))
def test_the_residual_wiring_and_its_backward(placement):
    """A sublayer f(x) = x^2 and a norm n(x) = sin x (elementwise, so the derivatives are plain):
    post-norm n(h + f(h)), pre-norm h + f(n(h)), and each backward the derivative of its forward."""
    h = np.linspace(-2.0, 2.0, 9)
    out = N.residual(h, np.square, np.sin, placement)
    want = np.sin(h + h ** 2) if placement == "post" else h + np.sin(h) ** 2
    np.testing.assert_allclose(out, want, rtol=1e-15)
    # a backward pass is handed the gradient of its output; each of these needs its input, saved by the forward
    saved = {}

    def f(x):
        saved["f"] = x
        return x ** 2

    def n(x):
        saved["n"] = x
        return np.sin(x)

    N.residual(h, f, n, placement)
    dh = N.residual_backward(np.ones_like(h), lambda d: d * 2 * saved["f"], lambda d: d * np.cos(saved["n"]),
                             placement)
    eps = 1e-6
    numeric = (N.residual(h + eps, np.square, np.sin, placement) - N.residual(h - eps, np.square, np.sin, placement))
    np.testing.assert_allclose(dh, numeric / (2 * eps), rtol=1e-8, atol=1e-9)


BASE = dict(vocab_size=11, n_ctx=7, d_model=8, n_heads=2, d_ff=12, n_layers=2)


def test_an_rmsnorm_model_has_gains_and_no_norm_biases():
    cfg = C.TransformerConfig(**BASE, norm="rmsnorm", norm_placement="pre", final_ln=True)
    shapes = C.param_shapes(cfg)
    norms = [n for n in shapes if ".ln" in n or n.startswith("ln")]
    assert norms == ["blocks.0.ln1.g", "blocks.0.ln2.g", "blocks.1.ln1.g", "blocks.1.ln2.g", "ln_final.g"]
    layer = C.param_shapes(C.TransformerConfig(**BASE, final_ln=True))
    assert {n for n in layer if n.endswith(".b") and "ln" in n} == {"blocks.0.ln1.b", "blocks.0.ln2.b",
                                                                      "blocks.1.ln1.b", "blocks.1.ln2.b", "ln_final.b"}
    # an encoder-decoder's cross-attention norm too, and its sublayer's parameters right after ln1
    pair = ed.EncoderDecoderConfig(C.TransformerConfig(**BASE, norm="rmsnorm", causal=False),
                                   C.TransformerConfig(**BASE, norm="rmsnorm", unembed_b=True))
    names = list(ed.param_shapes(pair))
    assert "dec.blocks.0.ln_cross.g" in names and not any(n.endswith(("ln_cross.b", "ln1.b")) for n in names)
    at = names.index("dec.blocks.0.ln1.g")
    assert names[at + 1:at + 5] == [f"dec.blocks.0.cross.{w}" for w in ("W_Q", "W_K", "W_V", "W_O")]


def test_the_compiled_steps_refuse_an_rmsnorm_model_by_name():
    cfg = C.TransformerConfig(**BASE, norm="rmsnorm", unembed_b=True)
    assert offsets.unsupported(C.TransformerConfig(**BASE, unembed_b=True)) is None
    assert "norm='rmsnorm'" in offsets.unsupported(cfg)
    with pytest.raises(ValueError, match="rmsnorm"):
        offsets.decoder_layout(cfg)
