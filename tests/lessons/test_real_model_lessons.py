"""The analyses of the real-model page: head detector, logit lens, rollout, edits, generation."""
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hst

from core.lessons import real_model as rm
from core.model.generation import generate
from core.model import transformer as tr
from core.model import config as C

V, N_CTX = 40, 24


def hand_built_induction_model():
    """Two one-head blocks: block 0 a previous-token head that copies the previous token into its own
    subspace; block 1 an induction head whose query is the current token and whose key is that copy.

    Residual layout (d = 2V + n_ctx): [ token one-hot | position one-hot | previous-token one-hot ].
    """
    A, P, Bs = slice(0, V), slice(V, V + N_CTX), slice(V + N_CTX, 2 * V + N_CTX)
    d = 2 * V + N_CTX
    cfg = C.TransformerConfig(vocab_size=V, n_ctx=N_CTX, d_model=d, n_heads=1, d_ff=4, n_layers=2, norm_placement="pre",
                               activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)
    p = {name: np.zeros(shape) for name, shape in C.param_shapes(cfg).items()}
    for name in p:
        if name.endswith(".g"):
            p[name] = np.ones(p[name].shape)
    p["embed"][:, A] = np.eye(V)
    p["pos"][:, P] = np.eye(N_CTX)
    # block 0: query at position i points at position i - 1; the value is the token, written to Bs
    shift = np.eye(N_CTX, k=-1)                                         # row p -> column p - 1
    p["blocks.0.attn.W_Q"][P, P] = 3 * shift
    p["blocks.0.attn.W_K"][P, P] = 3 * np.eye(N_CTX)
    p["blocks.0.attn.W_V"][A, A] = np.eye(V)
    p["blocks.0.attn.W_O"][A, Bs] = 0.3 * np.eye(V)
    # block 1: query the current token, key the previous-token copy
    p["blocks.1.attn.W_Q"][A, A] = 3 * np.eye(V)
    p["blocks.1.attn.W_K"][Bs, A] = 3 * np.eye(V)
    return p, cfg


def test_hand_built_induction_pair_is_found():
    p, cfg = hand_built_induction_model()
    scores = rm.detect_heads(p, cfg, n=10, batch=3)
    assert scores["previous-token"][0, 0] > 0.9 and scores["previous-token"][1, 0] < 0.3
    assert scores["induction"][1, 0] > 0.9 and scores["induction"][0, 0] < 0.3
    assert scores["duplicate-token"].max() < 0.3


def test_random_model_scores_low():
    cfg = C.TransformerConfig(vocab_size=50, n_ctx=48, d_model=32, n_heads=4, d_ff=64, n_layers=2, norm_placement="pre",
                               activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)
    scores = rm.detect_heads(C.init_params(cfg, seed=0, dtype=np.float64), cfg, n=20)
    assert scores["induction"].max() < 0.2 and scores["duplicate-token"].max() < 0.2
    for kind in rm.HEAD_KINDS:
        assert scores[kind].shape == (2, 4) and np.all((scores[kind] >= 0) & (scores[kind] <= 1))


def test_the_detector_holds_only_the_attention_maps_of_its_pass():
    """A real model's whole cache of the detector's pass (feed-forward activations above all) was
    260 MB for SmolLM2; only the maps are read."""
    import tracemalloc
    cfg = C.TransformerConfig(vocab_size=50, n_ctx=48, d_model=32, n_heads=4, d_ff=256, n_layers=4, norm_placement="pre",
                              activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)
    params = C.init_params(cfg, seed=0, dtype=np.float64)
    rm.detect_heads(params, cfg, n=20)                  # compiles, before memory is traced
    seq = rm.repeated_random_tokens(cfg.vocab_size, 20, batch=4, seed=0)
    tracemalloc.start()
    try:
        _, cache = tr.forward(params, cfg, seq)
        whole = sum(a.nbytes for a in cache.values())
        del cache
        tracemalloc.reset_peak()
        rm.detect_heads(params, cfg, n=20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    maps = cfg.n_layers * 4 * cfg.n_heads * 41 ** 2 * 8
    assert peak < 0.5 * whole and peak < 4 * maps, (peak, whole, maps)


def test_head_scores_on_a_known_pattern():
    n, T = 4, 8
    A = np.zeros((1, 1, 1, T, T))
    A[..., np.arange(1, T), np.arange(T - 1)] = 1.0                      # a perfect previous-token head
    A[..., 0, 0] = 1.0
    s = rm.head_scores(A, n)
    assert s["previous-token"][0, 0] == 1.0 and s["induction"][0, 0] == 0.0
    assert s["first-token"][0, 0] == pytest.approx(1 / T + 1 / T)         # row 0 and row 1 look at token 0


def test_rollout_of_one_layer_is_half_attention_half_identity():
    rng = np.random.default_rng(0)
    A = rng.random((1, 3, 5, 5))
    A /= A.sum(-1, keepdims=True)
    expected = 0.5 * A[0].mean(0) + 0.5 * np.eye(5)
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(rm.rollout(A)[0], expected, rtol=1e-14)
    two = rm.rollout(np.concatenate([A, A]))
    np.testing.assert_allclose(two[1], expected @ expected, rtol=1e-13)
    np.testing.assert_allclose(two.sum(-1), 1.0, rtol=1e-13)


def rollout_by_hand(weights):
    """Abnar & Zuidema's rollout in plain NumPy: each layer's head-mean map, half attention and half
    identity, rows renormalised; then R_l = Ā_l Ā_(l-1) ··· Ā_0, the latest layer on the left."""
    L, H, T, _ = weights.shape
    mixed = []
    for l in range(L):
        M = 0.5 * sum(weights[l, h] for h in range(H)) / H + 0.5 * np.eye(T)
        mixed.append(M / M.sum(axis=1, keepdims=True))
    return np.stack([np.linalg.multi_dot([np.eye(T), *mixed[l::-1], np.eye(T)]) for l in range(L)])


def test_rollout_multiplies_the_layers_latest_on_the_left():
    """Layers that differ: the rollout is Ā_l ··· Ā_0 (not Ā_0 ··· Ā_l, nor the first layer alone),
    a token's shares of the inputs summing to 1 after every layer. Row l of a causal model's rollout
    stays causal: a query draws on no later token through any number of layers."""
    rng = np.random.default_rng(3)
    T = 6
    A = rng.random((3, 2, T, T)) ** 4 * np.tril(np.ones((T, T)))         # three different causal layers
    A /= A.sum(-1, keepdims=True)
    R = rm.rollout(A)
    want = rollout_by_hand(A)
    np.testing.assert_allclose(R, want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(R.sum(-1), 1.0, rtol=1e-13)
    assert np.all(np.triu(R, 1) == 0)
    reversed_order = rollout_by_hand(A[::-1])[-1]                         # Ā_0 Ā_1 Ā_2: the same layers
    assert np.abs(want[-1] - reversed_order).max() > 1e-2                 # the order matters here
    assert np.abs(want[-1] - want[0]).max() > 1e-2                        # and so does every layer after the first


GPT_CFG = C.TransformerConfig(vocab_size=17, n_ctx=16, d_model=16, n_heads=4, d_ff=32, n_layers=3, norm_placement="pre",
                               activation="gelu_tanh", positional="learned", tied_unembed=True, final_ln=True)


def test_logit_lens_last_row_is_the_model_prediction():
    p = C.init_params(GPT_CFG, seed=1, dtype=np.float64)
    ids = np.array([1, 4, 2, 8, 5, 7])
    logits, cache = tr.forward(p, GPT_CFG, ids)
    top, prob = rm.logit_lens(p, GPT_CFG, cache)
    assert top.shape == prob.shape == (GPT_CFG.n_layers + 1, len(ids))
    np.testing.assert_array_equal(top[-1], logits[0].argmax(-1))
    np.testing.assert_allclose(prob[-1], np.exp(logits[0].max(-1)) / np.exp(logits[0]).sum(-1))
    assert not np.array_equal(top[0], top[-1])


def test_edits_move_the_next_token_probabilities():
    p = C.init_params(GPT_CFG, seed=2, dtype=np.float64)
    ids, other = np.array([1, 4, 2, 8, 5, 7]), np.array([3, 3, 9, 1])
    logits, cache = tr.forward(p, GPT_CFG, ids)
    _, other_cache = tr.forward(p, GPT_CFG, other)
    for how in ("zero", "mean", "patch"):
        rows = rm.edit_effect(p, GPT_CFG, ids, logits, rm.head_edit(cache, 1, 1, how, other_cache))
        assert max(abs(r["change"]) for r in rows) > 1e-4
        assert all(abs(r["after"] - r["before"] - r["change"]) < 1e-15 for r in rows)
    # the second prompt is shorter: aligned at the ends, its 4 positions replace the last 4
    patched = rm.head_edit(cache, 2, 1, "patch", other_cache)[(2, 1)]
    np.testing.assert_array_equal(patched[2:], other_cache["blocks.2.attn.head_outputs"][0, 1])
    np.testing.assert_array_equal(patched[:2], cache["blocks.2.attn.head_outputs"][0, 1, :2])
    rows = rm.edit_effect(p, GPT_CFG, ids, logits, rm.head_edit(cache, 2, 1, "patch", other_cache))
    assert max(abs(r["change"]) for r in rows) > 1e-4                  # the last position is patched
    with pytest.raises(ValueError):
        rm.head_edit(cache, 0, 0, "patch")


def test_generation_with_kv_cache_matches_full_recompute():
    """A real model's TransformerConfig generates through the one generate (core.model.generation)."""
    p = C.init_params(GPT_CFG, seed=3, dtype=np.float64)
    prompt = np.array([1, 2, 3])
    new = generate(p, GPT_CFG, prompt=prompt, max_new_tokens=6, temperature=0).new_tokens
    seq = list(prompt)
    for _ in range(6):
        logits, _ = tr.forward(p, GPT_CFG, seq)
        seq.append(int(logits[0, -1].argmax()))
    assert new.tolist() == seq[3:]
    room = GPT_CFG.n_ctx - 3 + 1                    # the last new token is never read: it needs no position
    assert len(generate(p, GPT_CFG, prompt=prompt, max_new_tokens=room, temperature=0).new_tokens) == room
    with pytest.raises(ValueError, match=f"Ask for at most {room} new tokens"):
        generate(p, GPT_CFG, prompt=prompt, max_new_tokens=room + 1)


def test_generation_runs_no_forward_pass_after_its_last_token(monkeypatch):
    p = C.init_params(GPT_CFG, seed=3, dtype=np.float64)
    steps = []
    real = tr.forward_checked
    monkeypatch.setattr(tr, "forward_checked", lambda *a, **k: steps.append(1) or real(*a, **k))
    gen = generate(p, GPT_CFG, prompt=np.array([1, 2, 3]), max_new_tokens=4, temperature=0)
    assert len(gen.new_tokens) == 4 and len(steps) == 1 + 3      # the prompt, then one pass per token after the first


def test_fit_context():
    ids, cut = rm.fit_context(np.arange(10), 4)
    assert ids.tolist() == [0, 1, 2, 3] and cut == 6
    assert rm.fit_context([5], 4)[1] == 0
    with pytest.raises(ValueError, match="empty"):
        rm.fit_context([], 4)


# ----------------------------------------------------------------------------------------------
# texts the page cuts, and tokens as bytes
# ----------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(hst.text(alphabet=hst.sampled_from("ab é😀\n"), max_size=40), hst.integers(1, 30))
def test_clip_text_keeps_a_start_of_whole_words_within_the_limit(text, limit):
    kept = rm.clip_text(text, limit)
    if len(text) <= limit:
        assert kept == text
        return
    assert len(kept) <= limit and text.startswith(kept) and kept == kept.rstrip()
    words = text[:limit].split()
    if len(words) > 1 or text[limit].isspace():               # a whole word fits: no word is split
        assert kept.split() == text[:len(kept)].split() and (kept == "" or text[len(kept)].isspace())


def read_back(shown: str) -> bytes:
    """The bytes of :func:`rm.bytes_as_text`'s text: <0xNN> one byte, the rest UTF-8."""
    parts = re.split(r"<0x([0-9A-F]{2})>", shown)
    return b"".join(bytes([int(p, 16)]) if i % 2 else p.encode() for i, p in enumerate(parts))


@settings(max_examples=300, deadline=None)
@given(hst.binary(max_size=24).filter(lambda data: b"<0x" not in data))
def test_bytes_as_text_loses_no_byte_and_draws_no_replacement_character(data):
    shown = rm.bytes_as_text(data)
    assert read_back(shown) == data
    assert ("\ufffd" in shown) == ("\ufffd".encode() in data)     # only a real U+FFFD in the text


def test_the_byte_alphabet_is_the_tokenizers_own():
    from tokenizers import pre_tokenizers

    assert sorted(rm.BYTE_OF.values()) == list(range(256))
    assert set(rm.BYTE_OF) == set(pre_tokenizers.ByteLevel.alphabet())
    assert rm.BYTE_OF["Ġ"] == ord(" ") and rm.BYTE_OF["Ċ"] == ord("\n") and rm.BYTE_OF["a"] == ord("a")


@pytest.mark.parametrize("text", ["I love 😀 and مرحبا", "a café, ☕ and 🤖\nthe end", "the query and the key"])
def test_the_shipped_gpts_tokens_are_the_texts_bytes(text):
    from core import pretrained

    m = pretrained.load(os.path.join(os.path.dirname(tr.__file__), "tiny_gpt"))
    ids = m.encode(text)
    texts = rm.token_texts(m, ids)
    assert len(texts) == len(ids) and "\ufffd" not in "".join(texts)
    assert b"".join(read_back(t) for t in texts) == text.encode("utf-8")
    assert rm.text_of(m, ids) == text
    assert rm.has_partial_character(texts) == any(len(c.encode()) > 1 for c in text)
    assert rm.parameter_count(m.params) == m.checkpoint_params
