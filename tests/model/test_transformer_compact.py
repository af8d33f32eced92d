"""The one transformer on compact weights (:class:`core.model.compact.CompactMatrix`, as a quantised
checkpoint's reader returns them): the same bits as the same model on the widened arrays, a block's
weights widened only when the pass reaches it, the token table never widened whole (its rows for
the tokens at hand, the tied unembedding a slice of the vocabulary at a time), and the checks."""
import numpy as np
import pytest

from core.model import config as C
from core.model import generation
from core.model import transformer as tr
from core.model import transformer_backward as tb
from core.model.compact import CompactMatrix

LLAMA = dict(vocab_size=19, n_ctx=16, d_model=24, n_heads=6, d_ff=20, n_layers=3, norm="rmsnorm",
             norm_placement="pre", activation="silu", gated_ffn=True, positional="rotary", rope_base=100.0,
             tied_unembed=True, final_ln=True, bias=False, n_kv_heads=2)
GPT = dict(vocab_size=19, n_ctx=16, d_model=24, n_heads=6, d_ff=20, n_layers=2, norm_placement="pre",
           activation="gelu_tanh", positional="learned", final_ln=True, unembed_b=True)
IDS = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2]])


class HalfMatrix(CompactMatrix):
    """Stored as float16, widened to ``dtype``; every widening is noted in ``log`` as ``(how, name)``."""

    def __init__(self, values, dtype, name: str, log: list):
        self.data, self.dtype, self.shape = values.astype(np.float16), np.dtype(dtype), values.shape
        self.name, self.log = name, log

    @property
    def nbytes(self):
        return self.data.nbytes

    def widen(self):
        self.log.append(("widen", self.name))
        return self.data.astype(self.dtype)

    def rows(self, ids):
        self.log.append(("rows", self.name))
        return self.data[ids].astype(self.dtype)


class Int8Matrix(HalfMatrix):
    """Stored as int8 with one scale per row (``row = q * scale``), widened to ``dtype``."""

    def __init__(self, values, dtype, name: str, log: list):
        super().__init__(values, dtype, name, log)
        self.scale = (np.abs(values).max(axis=1) / 127).astype(dtype)
        self.q = np.round(values / self.scale[:, None]).astype(np.int8)

    @property
    def nbytes(self):
        return self.q.nbytes + self.scale.nbytes

    def widen(self):
        self.log.append(("widen", self.name))
        return self.q * self.scale[:, None]

    def rows(self, ids):
        self.log.append(("rows", self.name))
        return self.q[ids] * self.scale[ids][..., None]


def compact_model(settings: dict, dtype, log: list):
    """``(cfg, compact params, the same params widened)``: every 2-D weight compact, int8 and float16 in turn."""
    cfg = C.TransformerConfig(**settings)
    rng = np.random.default_rng(0)
    params = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)
              for n, v in C.init_params(cfg, 0, dtype).items()}
    kinds = iter([Int8Matrix, HalfMatrix] * len(params))
    compact = {n: next(kinds)(v, dtype, n, log) if v.ndim == 2 else v for n, v in params.items()}
    widened = {n: v.widen() if isinstance(v, CompactMatrix) else v for n, v in compact.items()}
    log.clear()
    return cfg, compact, widened


@pytest.mark.parametrize("settings", [LLAMA, GPT], ids=["llama", "gpt"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_compact_weights_give_the_widened_models_bits(settings, dtype, monkeypatch):
    """Logits and every cache entry equal, bit for bit; the tied unembedding in slices of 7 tokens (3 slices)."""
    monkeypatch.setattr(tr, "VOCAB_SLICE", 7)
    log = []
    cfg, compact, widened = compact_model(settings, dtype, log)
    logits, cache = tr.forward(compact, cfg, IDS)
    want, want_cache = tr.forward(widened, cfg, IDS)
    assert logits.dtype == dtype and cache.keys() == want_cache.keys()
    np.testing.assert_array_equal(logits, want)
    for name, value in want_cache.items():
        np.testing.assert_array_equal(cache[name], value, err_msg=name)
    assert ("rows", "embed") in log and ("widen", "embed") not in log      # the token table: its rows, never whole
    if cfg.tied_unembed:
        assert log.count(("rows", "embed")) == 1 + 3                       # the tokens, then 3 slices of the vocabulary


def test_a_block_is_widened_when_the_pass_reaches_it(monkeypatch):
    log = []
    cfg, compact, _ = compact_model(LLAMA, np.float32, log)
    run_block = tr.block

    def noted(h, p, cfg, cache, name, **options):
        log.append(("run", name))
        return run_block(h, p, cfg, cache, name, **options)

    monkeypatch.setattr(tr, "block", noted)
    tr.forward(compact, cfg, IDS)
    order = [f"{how} {name}" for how, name in log]
    for i in range(cfg.n_layers):
        widened = [k for k, entry in enumerate(order) if entry.startswith(f"widen blocks.{i}.")]
        assert len(widened) == 7                                           # W_Q, W_K, W_V, W_O, W_gate, W_1, W_2
        assert max(widened) < order.index(f"run blocks.{i}")
        assert i == 0 or min(widened) > order.index(f"run blocks.{i - 1}")


def test_generation_and_gradients_on_compact_weights():
    log = []
    cfg, compact, widened = compact_model(LLAMA, np.float64, log)
    ours = generation.generate(compact, cfg, prompt=IDS[0, :3], max_new_tokens=5, seed=1)
    want = generation.generate(widened, cfg, prompt=IDS[0, :3], max_new_tokens=5, seed=1)
    np.testing.assert_array_equal(ours.step_logits, want.step_logits)
    np.testing.assert_array_equal(ours.tokens, want.tokens)
    loss, grads = tb.loss_and_grads(compact, cfg, IDS, IDS)
    want_loss, want_grads = tb.loss_and_grads(widened, cfg, IDS, IDS)
    assert loss == want_loss
    for name, value in want_grads.items():
        np.testing.assert_array_equal(grads[name], value, err_msg=name)


def test_compact_weights_are_checked_as_arrays_are():
    log = []
    cfg, compact, widened = compact_model(LLAMA, np.float32, log)
    W = widened["blocks.1.attn.W_K"]
    for bad, words in ((HalfMatrix(W.T, np.float32, "W", log), r"shape \(8, 24\)"),
                       (HalfMatrix(W, np.float64, "W", log), "float64 but 'embed' is float32"),
                       (HalfMatrix(np.ones((24, 1)), np.float32, "g", log), "shape")):
        with pytest.raises(ValueError, match=words):
            tr.forward({**compact, "blocks.1.attn.W_K": bad}, cfg, IDS)
    gain = HalfMatrix(np.ones((1, 24)), np.float32, "g", log)
    gain.shape = (24,)                                                     # a vector passed off as compact
    with pytest.raises(ValueError, match="only 2-D weights may be kept compact"):
        tr.forward({**compact, "blocks.1.ln1.g": gain}, cfg, IDS)
    broken = HalfMatrix(np.full((19, 24), np.inf), np.float32, "embed", log)
    with pytest.raises(ValueError, match="NaN or infinity"):
        C.check_params({**compact, "embed": broken}, cfg, finite=True)
