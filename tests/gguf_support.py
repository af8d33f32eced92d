"""Small GGUF files for the GGUF reader's tests, written by gguf-py's own writer (the library
llama.cpp's converter uses) as the converter lays a Llama out: llama.cpp's names, the query and key
rows reordered for its rotary, 2-D weights quantised."""
import numpy as np

from oracle_support import require

# A tiny Llama: rows of 64 and 96 numbers (whole blocks of 32), 4 query heads over 2 key/value heads
TINY = dict(d=64, heads=4, kv_heads=2, d_ff=96, layers=2, n_ctx=32, rope_base=10000.0, eps=1e-5)


def byte_alphabet() -> list[str]:
    """GPT-2's 256 byte characters, byte by byte (printable bytes as themselves, the rest moved past 255)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(moved)) for b in range(256)]


def tiny_tokenizer():
    """``(tokens, merges, token_types)``: the control token, the 256 bytes, and three merges."""
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens = ["<|endoftext|>", *byte_alphabet(), "Ġt", "he", "Ġthe"]
    return tokens, merges, [3] + [1] * (len(tokens) - 1)


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of a query or key weight's rows (its ``LlamaModel.permute``):
    each head's rows ``(2, d_k/2)`` become ``(d_k/2, 2)``, neighbours paired for its rotary."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_llama_weights(seed: int = 0, **sizes) -> dict:
    """A tiny Llama's weights as transformers names and lays them out (``(out, in)``), float32."""
    s = {**TINY, **sizes}
    rng = np.random.default_rng(seed)
    d, F, kv = s["d"], s["d_ff"], s["kv_heads"] * s["d"] // s["heads"]
    V = len(tiny_tokenizer()[0])
    w = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                  p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                  p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d),
                  p + "mlp.down_proj.weight": (d, F), p + "input_layernorm.weight": (d,),
                  p + "post_attention_layernorm.weight": (d,)})
    return {k: ((1.0 if len(shape) == 1 else 0.0) + 0.2 * rng.standard_normal(shape)).astype(np.float32)
            for k, shape in w.items()}


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    """transformers' tensor name as llama.cpp writes it."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, *rest = hf.split(".")
    return f"blk.{i}.{GGUF_NAMES['.'.join(rest[:-1])]}.weight"


def write_llama_gguf(path, weights: dict, *, weight_type="Q4_1", embed_type="Q8_0", arch="llama",
                     metadata=None, drop=(), tokenizer=None, alignment=None, **sizes) -> str:
    """A Llama GGUF at ``path`` as llama.cpp's converter writes one: ``weights`` (transformers' names,
    ``(out, in)``) renamed, the query and key rows reordered, 2-D weights quantised to ``weight_type``
    (the embedding to ``embed_type``), norms F32; the ``llama.*`` metadata for ``sizes`` and the
    tokenizer's. ``metadata`` adds or replaces keys (a value ``(value, GGUFValueType)``), ``drop``
    leaves keys out. Returns the path."""
    gguf = require("gguf")
    s = {**TINY, **sizes}
    tokens, merges, types = tokenizer or tiny_tokenizer()
    T = gguf.GGUFValueType
    kv = {f"{arch}.block_count": (s["layers"], T.UINT32), f"{arch}.context_length": (s["n_ctx"], T.UINT32),
          f"{arch}.embedding_length": (s["d"], T.UINT32), f"{arch}.feed_forward_length": (s["d_ff"], T.UINT32),
          f"{arch}.attention.head_count": (s["heads"], T.UINT32),
          f"{arch}.attention.head_count_kv": (s["kv_heads"], T.UINT32),
          f"{arch}.rope.freq_base": (s["rope_base"], T.FLOAT32),
          f"{arch}.attention.layer_norm_rms_epsilon": (s["eps"], T.FLOAT32),
          "tokenizer.ggml.model": ("gpt2", T.STRING), "tokenizer.ggml.pre": ("smollm", T.STRING),
          "tokenizer.ggml.tokens": (tokens, T.ARRAY), "tokenizer.ggml.merges": (merges, T.ARRAY),
          "tokenizer.ggml.token_type": (types, T.ARRAY), "tokenizer.ggml.bos_token_id": (0, T.UINT32),
          "tokenizer.ggml.eos_token_id": (0, T.UINT32)}
    kv.update(metadata or {})
    writer = gguf.GGUFWriter(str(path), arch)
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, (value, kind) in kv.items():
        if key not in drop:
            writer.add_key_value(key, value, kind, sub_type=_array_type(value, T) if kind == T.ARRAY else None)
    for hf, w in weights.items():
        name = gguf_name(hf)
        if "attn_q" in name or "attn_k" in name:
            w = llama_cpp_permute(w, s["heads"] if "attn_q" in name else s["kv_heads"])
        kind = "F32" if w.ndim == 1 else embed_type if name == "token_embd.weight" else weight_type
        qtype = gguf.GGMLQuantizationType[kind]
        data = w if kind == "F32" else gguf.quants.quantize(w, qtype)
        writer.add_tensor(name, data, raw_dtype=None if kind == "F32" else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _array_type(value, T):
    first = value[0]
    return T.STRING if isinstance(first, str) else T.FLOAT32 if isinstance(first, float) else T.INT32
