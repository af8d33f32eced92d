"""A Llama GGUF as our model: the config from its metadata, every parameter the weights llama.cpp's
converter quantised (rows of the query and key put back in transformers' order), the packaged SmolLM2
as ``pretrained.load`` returns it, and a ValueError for a file that is not a whole Llama."""
import numpy as np
import pytest

from core import pretrained
from core.model import config as C
from core.model.compact import CompactMatrix, wide
from core.model.gguf import model as G
from core.model.gguf.matrix import Q4_1Matrix, Q8_0Matrix
from gguf_support import TINY, llama_cpp_permute, random_llama_weights, write_llama_gguf
from oracle_support import require


def quantised(w: np.ndarray, kind: str) -> np.ndarray:
    """``w`` packed and unpacked by gguf-py: the float32 values a file of that format holds."""
    gguf = require("gguf")
    qtype = gguf.GGMLQuantizationType[kind]
    return np.asarray(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype), dtype=np.float32)


OURS = {"self_attn.q_proj": "attn.W_Q", "self_attn.k_proj": "attn.W_K", "self_attn.v_proj": "attn.W_V",
        "self_attn.o_proj": "attn.W_O", "mlp.gate_proj": "ffn.W_gate", "mlp.up_proj": "ffn.W_1",
        "mlp.down_proj": "ffn.W_2", "input_layernorm": "ln1.g", "post_attention_layernorm": "ln2.g"}


def our_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "embed"
    if hf == "model.norm.weight":
        return "ln_final.g"
    if hf == "lm_head.weight":
        return "unembed"
    _, _, i, *rest = hf.split(".")
    return f"blocks.{i}.{OURS['.'.join(rest[:-1])]}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_0", "F16", "F32"])
def test_every_parameter_is_the_stored_weight_in_our_orientation(tiny_llama, tmp_path, kind, dtype):
    """Each 2-D weight as the file stores it (``kind``; the embedding Q8_0), unpacked by gguf-py."""
    path, weights = tiny_llama
    if kind != "Q4_1":
        path = write_llama_gguf(tmp_path / f"{kind}.gguf", weights, weight_type=kind)
    model = pretrained.load(path, dtype)
    assert model.family == "llama" and model.source == path
    assert set(model.params) == set(C.param_shapes(model.config))
    for hf, w in weights.items():
        value = model.params[our_name(hf)]
        if w.ndim == 1:                                  # norm gains: F32, as written
            expected = w
        elif hf == "model.embed_tokens.weight":          # (V, d), as stored
            expected = quantised(w, "Q8_0")
        else:                                            # (out, in) -> our (in, out)
            expected = quantised(w, kind).T
        assert value.shape == C.param_shapes(model.config)[our_name(hf)] and value.dtype == dtype, hf
        assert isinstance(value, CompactMatrix) == (w.ndim == 2 and (kind != "F32" or "embed" in hf)), hf
        assert np.array_equal(wide(value), expected.astype(dtype)), hf


def test_the_config_comes_from_the_metadata(tiny_llama):
    cfg = pretrained.load(tiny_llama[0]).config
    assert (cfg.vocab_size, cfg.n_ctx, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.n_layers) == \
        (260, TINY["n_ctx"], TINY["d"], TINY["heads"], TINY["kv_heads"], TINY["d_ff"], TINY["layers"])
    assert (cfg.rope_base, cfg.ln_eps) == (TINY["rope_base"], float(np.float32(TINY["eps"])))
    assert (cfg.norm, cfg.norm_placement, cfg.activation, cfg.gated_ffn, cfg.positional) == \
        ("rmsnorm", "pre", "silu", True, "rotary")
    assert not cfg.bias and cfg.tied_unembed and cfg.final_ln and cfg.causal


def test_an_output_weight_unties_the_unembedding(tmp_path):
    weights = random_llama_weights(seed=2)
    weights["lm_head.weight"] = 0.2 * np.random.default_rng(5).standard_normal((260, TINY["d"])).astype(np.float32)
    model = pretrained.load(write_llama_gguf(tmp_path / "untied.gguf", weights))
    assert not model.config.tied_unembed
    assert np.array_equal(model.params["unembed"].widen(), quantised(weights["lm_head.weight"], "Q4_1").T)


def test_the_rotary_row_order_undoes_llama_cpps_permutation():
    rows = np.arange(3 * 8)[:, None] * np.ones((1, 2))    # row r holds r: 3 heads of 8 features
    assert np.array_equal(llama_cpp_permute(rows, 3)[G.rotary_row_order(3, 8)], rows)


def test_the_packaged_smollm2(smollm2_file):
    model = pretrained.load(smollm2_file, np.float32)
    cfg = model.config
    assert (cfg.vocab_size, cfg.n_ctx, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.n_layers) == \
        (49152, 8192, 576, 9, 3, 1536, 30)
    assert cfg.rope_base == 100000.0 and abs(cfg.ln_eps - 1e-5) < 1e-12 and cfg.tied_unembed
    assert model.checkpoint_params == C.param_count(cfg) == 134_515_008
    assert isinstance(model.params["embed"], Q8_0Matrix)
    assert all(isinstance(model.params[f"blocks.{i}.{w}"], Q4_1Matrix) for i in range(30) for w in OURS.values()
               if w.startswith(("attn", "ffn")))
    assert all(isinstance(model.params[n], np.ndarray) for n in model.params if n.endswith(".g"))
    compact = sum(v.nbytes for v in model.params.values())
    assert compact < 100_000_000                          # the file's size, not float32's 538 MB
    ids = model.encode("Hello, world! 123")
    assert model.decode(ids) == "Hello, world! 123" and model.token_id("<|im_end|>") == 2


# ----------------------------------------------------------------------------------------------
# files that are not a whole Llama
# ----------------------------------------------------------------------------------------------
def test_another_architecture_is_refused(tmp_path):
    path = write_llama_gguf(tmp_path / "gpt2.gguf", random_llama_weights(), arch="gpt2")
    with pytest.raises(ValueError, match="holds a gpt2 model .*only the Llama family"):
        pretrained.load(path)


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length", "llama.attention.head_count",
                                 "llama.feed_forward_length", "llama.context_length",
                                 "llama.attention.layer_norm_rms_epsilon"])
def test_metadata_missing_a_needed_key_is_refused(tmp_path, key):
    path = write_llama_gguf(tmp_path / "partial.gguf", random_llama_weights(), drop=(key,))
    with pytest.raises(ValueError, match=f"has no {key} in its metadata"):
        pretrained.load(path)


def test_a_missing_or_misshapen_tensor_is_refused(tmp_path):
    weights = random_llama_weights()
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="no tensor 'blk.1.ffn_up.weight'"):
        pretrained.load(write_llama_gguf(tmp_path / "missing.gguf", weights))
    T = require("gguf").GGUFValueType
    path = write_llama_gguf(tmp_path / "wide.gguf", random_llama_weights(),
                            metadata={"llama.feed_forward_length": (128, T.UINT32)})
    with pytest.raises(ValueError, match="'blk.0.ffn_gate.weight' has shape \\(96, 64\\) but the metadata's"):
        pretrained.load(path)



def test_a_pass_keeping_nothing_joins_the_products_and_gives_the_full_passs_logits(tmp_path, monkeypatch):
    """At BLAS's sizes a pass multiplies a layer's queries, keys and values as one product; with
    ``keep=()`` also SwiGLU's gate and up as one (no separate SiLU), and attention without its weights.
    Both give the logits of the pass that multiplies each weight alone, to float32 rounding."""
    from core.model import layers as L
    from core.model.tuned import forward as TF
    from core.recording import recording

    sizes = dict(d=384, heads=6, kv_heads=2, d_ff=96, layers=2, n_ctx=64)
    model = pretrained.load(write_llama_gguf(tmp_path / "wide.gguf", random_llama_weights(seed=4, **sizes),
                                             **sizes), np.float32)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=40)
    with recording() as ran:
        full, _ = model.forward(ids)
    assert TF.silu in ran.functions() and TF.attention not in ran.functions()
    with recording() as ran:
        lean, _ = model.forward(ids, keep=())
    assert TF.silu not in ran.functions() and TF.attention in ran.functions()
    with monkeypatch.context() as m:
        m.setattr(L, "dense_joined", lambda *args, **kw: None)
        alone, _ = model.forward(ids)
    for logits in (full, lean):
        np.testing.assert_allclose(logits, alone, rtol=1e-4, atol=1e-4 * np.abs(alone).max())


# In a fresh process: the warm-up's step for the models' compiled loops, then a loaded Llama's passes
# (the page's, one keeping nothing, a generated token's); prints the kernels they compiled anew.
AFTER_THE_WARM_UP = """
import json, sys
import numpy as np
from core import pretrained, warmup
from core.kernels.tuned import cpu as C
from core.model.gguf import product as P
from core.model.tuned import forward as TF
warmup._readable_loops()
kernels = {"product_many": P._product_many, "product_few": P._product_few, "rms_norm": TF._rms_norm_rows,
           "rotate": TF._rotate, "softmax": TF._softmax_rows, "silu": TF._silu_flat,
           "fused": C._fused_kernel[0], "fused_threaded": C._fused_kernel[1]}
before = {name: len(k.signatures) for name, k in kernels.items()}
model = pretrained.load(sys.argv[1], np.float32)
for T in (40, 4):
    ids = np.arange(T)
    model.forward(ids), model.forward(ids, keep=()), model.forward(ids, keep=("attn.weights",))
kv = [{} for _ in range(model.config.n_layers)]
model.forward(np.arange(4), kv=kv), model.forward(np.arange(1), kv=kv, start=4)
print(json.dumps(sorted(name for name, k in kernels.items() if len(k.signatures) != before[name])))
"""


def test_the_warm_up_compiles_what_a_loaded_llamas_passes_run(tmp_path):
    """A loaded file's weights and norms are read-only arrays, its rotary angles and masks are kept:
    each is a type of its own to Numba. The warm-up compiles those types, so that no pass of a page
    compiles on the page's thread (seconds) once the warm-up is done."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    sizes = dict(d=384, heads=6, kv_heads=2, d_ff=96, layers=1, n_ctx=64)
    path = write_llama_gguf(tmp_path / "wide.gguf", random_llama_weights(seed=4, **sizes), **sizes)
    run = subprocess.run([sys.executable, "-c", AFTER_THE_WARM_UP, str(path)], cwd=Path(__file__).resolve().parents[3],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
