"""The lessons behind the model pages hold to their formulas: every number a walkthrough step shows
is recomputed here from the step before it (or from the parameters), mean ablation fills a head with
its mean and zero ablation with nothing, and the induction lesson picks its heads from the layers it
names. Each test was checked against a planted bug (see the docstrings)."""
import numpy as np
import pytest

from core.kernels import reference
from core.lessons import inside
from core.lessons import induction as I
from core.model.tuned.classifier import EncoderConfig
from test_inside import SMALL, _params, _reference, _tokens


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


def test_best_heads_come_from_the_layers_the_lesson_names():
    """Fails when the previous-token head is chosen from layer 2's scores or the induction head from
    layer 1's: every layer's argmax differs here."""
    induction = np.array([[0.9, 0.1, 0.2, 0.3], [0.1, 0.2, 0.8, 0.3]])
    previous = np.array([[0.1, 0.2, 0.3, 0.7], [0.6, 0.2, 0.1, 0.0]])
    m = I.Measures(induction=induction, previous=previous, loss_first=np.zeros(4), loss_repeated=np.zeros(4),
                   loss_first_occurrence=0.0, loss_repeated_segment=0.0, acc_repeated_segment=0.0,
                   loss_repeat_start=0.0, attn=np.zeros((2, 1, 4, 4, 4)))
    assert I.best_heads(m) == (3, 2)      # layer 1's best previous-token head, layer 2's best induction head
