"""Generation's sampler settings reach the sampler once: the distribution each token is drawn from
is ``softmax(logits / T)`` of the model's own logits, recomputed here from a teacher-forced pass,
and the tokens are those an independent inverse-CDF draw picks with the same generator."""
import numpy as np
import pytest

from core.model import decoder as D
from core.model import presets


def _model(kind):
    sizes = dict(vocab_size=11, n_ctx=12, d_model=16, n_heads=4, d_ff=24, n_layers=2)
    if kind == "encoder-decoder":
        cfg = presets.seq2seq(**sizes, src_vocab_size=10, src_len=5, bos_id=10)
    else:
        cfg = presets.decoder_lm(**sizes)
    params = D.init_params(cfg, seed=4, dtype=np.float64)
    params["unembed"] *= 4.0              # spread the logits: T and T^2 then give different tokens
    src = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]) if kind == "encoder-decoder" else None
    return cfg, params, src


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _inverse_cdf_draws(probs, seed):
    """``(B, n)`` tokens: for each step, then each sequence, the first id whose cumulative
    probability exceeds one uniform draw of ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    B, n, _ = probs.shape
    tokens = np.zeros((B, n), dtype=np.int64)
    for s in range(n):
        for b in range(B):
            cdf = np.cumsum(probs[b, s])
            tokens[b, s] = np.searchsorted(cdf, rng.random() * cdf[-1], side="right")
    return tokens


@pytest.mark.parametrize("kind", ["decoder-only", "encoder-decoder"])
@pytest.mark.parametrize("temperature", [0.5, 2.5])
def test_each_token_is_drawn_from_softmax_of_the_logits_over_t(kind, temperature):
    cfg, params, src = _model(kind)
    prompt, n, seed = [[10, 2], [10, 7]], 9, 3
    gen = D.generate(params, cfg, src, prompt=prompt, max_new_tokens=n, temperature=temperature, seed=seed)
    # the model's logits for every new token, from one teacher-forced pass over the generated text
    logits, _ = D.forward(params, cfg, gen.tokens[:, :-1], src)
    logits = logits[:, len(prompt[0]) - 1:]                                # (B, n, V)
    np.testing.assert_allclose(gen.step_logits, logits, rtol=1e-12, atol=1e-12)
    want = _softmax(logits / temperature)
    np.testing.assert_allclose(gen.step_probs, want, rtol=1e-9, atol=1e-15)
    # the same draws, in generate's order (step by step, sequence by sequence), inverted by hand
    np.testing.assert_array_equal(gen.new_tokens, _inverse_cdf_draws(want, seed))
    # the test has teeth: temperature applied twice would draw other tokens from the same draws
    twice = _softmax(logits / temperature ** 2)
    assert not np.array_equal(_inverse_cdf_draws(twice, seed), gen.new_tokens)


def test_temperature_one_and_greedy_read_the_raw_logits():
    cfg, params, _ = _model("decoder-only")
    gen = D.generate(params, cfg, prompt=[1, 2], max_new_tokens=6, temperature=1.0, seed=0)
    np.testing.assert_allclose(gen.step_probs, _softmax(gen.step_logits), rtol=1e-12, atol=1e-15)
    greedy = D.generate(params, cfg, prompt=[1, 2], max_new_tokens=6, temperature=0.0, seed=0)
    np.testing.assert_array_equal(greedy.new_tokens, greedy.step_logits.argmax(axis=-1))
