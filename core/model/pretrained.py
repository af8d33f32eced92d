"""Real models: GPT-2- and BERT-family checkpoints in the Hugging Face format, run on our own transformer.

A checkpoint is a folder with ``config.json``, ``model.safetensors`` and (optionally)
``tokenizer.json``; a Hub name (``gpt2``, ``distilgpt2``) is the same three files downloaded by
``huggingface_hub`` into its usual cache. Weights are read from safetensors only: a pickled
``pytorch_model.bin`` can run code when it is opened, so it is never opened.

GPT-2's tensors map to the project's vocabulary (:mod:`core.model.transformer`)::

    wte                  -> embed (V, d)           and the unembedding, tied: logits = h @ embed^T
    wpe                  -> pos (n_ctx, d)
    h.{i}.ln_1 / ln_2    -> blocks.{i}.ln1 / ln2   (.weight -> .g, .bias -> .b)
    h.{i}.attn.c_attn    -> blocks.{i}.attn.W_Q | W_K | W_V   (d, 3d) split along the output axis
    h.{i}.attn.c_proj    -> blocks.{i}.attn.W_O
    h.{i}.mlp.c_fc       -> blocks.{i}.ffn.W_1     h.{i}.mlp.c_proj -> blocks.{i}.ffn.W_2
    ln_f                 -> ln_final

GPT-2's ``Conv1D`` stores its weight as ``(d_in, d_out)`` and computes ``x @ W + b``, as we do, so
no weight is transposed. Keys may carry a ``transformer.`` prefix (``GPT2LMHeadModel``) or not
(``GPT2Model``); both load. BERT's mapping is in :mod:`core.model.bert_format`.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from core.model import bert_format, presets

from core.model import minilm_package
from core.model import transformer as tr
from core.model import config as C

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
# GPT-2's activation names: "gelu_new" is the tanh form, as is "gelu_pytorch_tanh"
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu"}
HUB_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
BUFFERS = (".attn.bias", ".attn.masked_bias")     # GPT-2's causal-mask buffers, saved by old checkpoints
HEADS_NOT_READ = ("cls.", "lm_head.")             # BERT's pre-training heads; GPT-2's copy of its tied wte


# ----------------------------------------------------------------------------------------------
# the configuration: GPT-2's config.json <-> our TransformerConfig
# ----------------------------------------------------------------------------------------------
FAMILIES = ("gpt2", "bert")


def check_family(hf: dict) -> str:
    """The checkpoint's ``model_type``, when it is one we run; a ValueError naming the ones we do."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"This is a {family or 'unnamed'} model: only the GPT-2 family (model_type 'gpt2': "
                         f"gpt2, distilgpt2, ...) and the BERT family (model_type 'bert': bert-base-uncased, "
                         f"all-MiniLM-L6-v2, ...) can be loaded here.")
    return family


def config_from_gpt2(hf: dict) -> C.TransformerConfig:
    """Our config for a GPT-2 ``config.json``; a ValueError for another family or a variant we don't run."""
    if check_family(hf) != "gpt2":
        raise ValueError(f"This is a {hf['model_type']} model, not a GPT-2 one.")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(f"Activation {act!r} is not supported; GPT-2 uses 'gelu_new' (GELU, tanh form).")
    for flag, ok in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                     ("scale_attn_weights", True)):
        if hf.get(flag, ok) != ok:
            raise ValueError(f"This checkpoint sets {flag}={hf[flag]!r}; only GPT-2's standard attention "
                             f"({flag}={ok}) is supported.")
    d = hf.get("n_embd", 768)
    return presets.gpt2(vocab_size=hf.get("vocab_size", 50257), n_ctx=hf.get("n_positions", 1024), d_model=d,
                        n_heads=hf.get("n_head", 12), d_ff=hf.get("n_inner") or 4 * d, n_layers=hf.get("n_layer", 12),
                        activation=ACTIVATIONS[act], ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)))


def gpt2_config(cfg: C.TransformerConfig) -> dict:
    """GPT-2's ``config.json`` for one of our configs; a ValueError when the architecture isn't GPT-2's."""
    wanted = dict(norm_placement="pre", positional="learned", tied_unembed=True, final_ln=True, bias=True, causal=True,
                  head="lm", unembed_b=False)
    wrong = [f"{k}={getattr(cfg, k)!r} (GPT-2: {v!r})" for k, v in wanted.items() if getattr(cfg, k) != v]
    if cfg.d_ff == 0:
        wrong.append("d_ff=0, no feed-forward sublayer (GPT-2 has one in every block)")
    if wrong:
        raise ValueError("The GPT-2 format holds only GPT-2's architecture; this model has " + ", ".join(wrong) + ".")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_ctx, "n_embd": cfg.d_model, "n_head": cfg.n_heads, "n_layer": cfg.n_layers,
            "n_inner": cfg.d_ff, "layer_norm_epsilon": cfg.ln_eps,
            "activation_function": "gelu_new" if cfg.activation == "gelu_tanh" else "relu",
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True}


# ----------------------------------------------------------------------------------------------
# the weights: GPT-2's tensors <-> our parameters
# ----------------------------------------------------------------------------------------------
def params_from_gpt2(tensors: dict, cfg: C.TransformerConfig, dtype=np.float32) -> dict[str, np.ndarray]:
    """Our parameters from GPT-2's tensors (names with or without ``transformer.``), read-only.

    ``c_attn``'s three column blocks are views, not copies, so a float32 checkpoint loaded as
    float32 costs its own size once.
    """
    t = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    d = cfg.d_model

    def get(name):
        if name not in t:
            raise ValueError(f"The weights have no tensor {name!r}: this is not a complete GPT-2 checkpoint.")
        return np.asarray(t[name]).astype(dtype, copy=False)

    p = {"embed": get("wte.weight"), "pos": get("wpe.weight")}
    for i in range(cfg.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        W, bias = get(h + "attn.c_attn.weight"), get(h + "attn.c_attn.bias")         # (d, 3d), (3d,)
        for k, name in enumerate("QKV"):
            p[f"{b}attn.W_{name}"] = W[:, k * d:(k + 1) * d]
            p[f"{b}attn.b_{name}"] = bias[k * d:(k + 1) * d]
        p[b + "attn.W_O"], p[b + "attn.b_O"] = get(h + "attn.c_proj.weight"), get(h + "attn.c_proj.bias")
        p[b + "ln1.g"], p[b + "ln1.b"] = get(h + "ln_1.weight"), get(h + "ln_1.bias")
        p[b + "ffn.W_1"], p[b + "ffn.b_1"] = get(h + "mlp.c_fc.weight"), get(h + "mlp.c_fc.bias")
        p[b + "ffn.W_2"], p[b + "ffn.b_2"] = get(h + "mlp.c_proj.weight"), get(h + "mlp.c_proj.bias")
        p[b + "ln2.g"], p[b + "ln2.b"] = get(h + "ln_2.weight"), get(h + "ln_2.bias")
    p["ln_final.g"], p["ln_final.b"] = get("ln_f.weight"), get("ln_f.bias")
    C.check_params(p, cfg)                              # shapes agree with config.json
    for value in p.values():
        value.setflags(write=False)                      # one copy, shared by every session
    return p


def gpt2_tensors(params: dict, cfg: C.TransformerConfig) -> dict[str, np.ndarray]:
    """GPT-2's tensors (``GPT2LMHeadModel`` names) for our parameters: the inverse of :func:`params_from_gpt2`."""
    C.check_params(params, cfg)
    t = {"transformer.wte.weight": params["embed"], "transformer.wpe.weight": params["pos"]}
    for i in range(cfg.n_layers):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        t[h + "attn.c_attn.weight"] = np.concatenate([params[f"{b}attn.W_{n}"] for n in "QKV"], axis=1)
        t[h + "attn.c_attn.bias"] = np.concatenate([params[f"{b}attn.b_{n}"] for n in "QKV"])
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = params[b + "attn.W_O"], params[b + "attn.b_O"]
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = params[b + "ln1.g"], params[b + "ln1.b"]
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = params[b + "ffn.W_1"], params[b + "ffn.b_1"]
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = params[b + "ffn.W_2"], params[b + "ffn.b_2"]
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = params[b + "ln2.g"], params[b + "ln2.b"]
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = params["ln_final.g"], params["ln_final.b"]
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


# ----------------------------------------------------------------------------------------------
# a loaded model
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """A checkpoint ready to run: our config, our parameters (read-only) and its tokenizer.

    ``family`` is ``"gpt2"`` (a causal language model: ``forward`` returns logits) or ``"bert"`` (an
    encoder: ``forward`` returns the last hidden states). ``checkpoint_params`` counts the numbers
    in the checkpoint's float tensors, as read from the file (not GPT-2's mask buffers, nor heads
    that are not run: BERT's pre-training heads, a saved copy of a tied unembedding).
    """

    config: C.TransformerConfig
    params: dict
    tokenizer: object | None = None          # a ``tokenizers.Tokenizer``, or None without tokenizer.json
    source: str = ""
    family: str = "gpt2"
    checkpoint_params: int = 0

    @property
    def is_encoder(self) -> bool:
        return self.family == "bert"

    def encode(self, text: str) -> np.ndarray:
        """The token ids ``(T,)`` of ``text``, as the checkpoint's tokenizer cuts it (every id, even
        past the context: cutting is the caller's choice). A BERT tokenizer puts ``[CLS]`` in front
        and ``[SEP]`` at the end."""
        self._need_tokenizer()
        if not isinstance(text, str) or not text:
            raise ValueError("The text is empty: type something to run the model on.")
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        self._need_tokenizer()
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def tokens(self, ids) -> list[str]:
        """Each id as the text it stands for, for labels on the page: GPT-2's with its spaces (as
        itself), BERT's word pieces as the vocabulary spells them (``[CLS]``, ``##ing``)."""
        self._need_tokenizer()
        if self.is_encoder:
            return [self.tokenizer.id_to_token(int(i)) for i in np.asarray(ids).reshape(-1)]
        return [self.tokenizer.decode([int(i)]) for i in np.asarray(ids).reshape(-1)]

    def token_id(self, token: str) -> int | None:
        """The id of a special token (``[CLS]``, ``<|endoftext|>``), or None when there is none."""
        return None if self.tokenizer is None else self.tokenizer.token_to_id(token)

    def forward(self, ids, **kwargs):
        """:func:`core.model.transformer.forward` on this model: ``(logits (B, T, V), cache)`` for
        GPT-2, ``(last_hidden_state (B, T, d), cache)`` for BERT (``key_mask`` for padding)."""
        return tr.forward(self.params, self.config, ids, **kwargs)

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"{self.source or 'This model'} has no tokenizer.json, so it cannot turn text "
                             f"into tokens; put the checkpoint's tokenizer.json beside config.json.")


def _read_folder(folder: str, dtype) -> Model:
    files = set(os.listdir(folder))
    if CONFIG_FILE not in files:
        raise ValueError(f"{folder} has no config.json: a checkpoint folder holds config.json, "
                         f"model.safetensors and tokenizer.json.")
    if WEIGHTS_FILE not in files:
        pickled = sorted(f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt")))
        if pickled:
            raise ValueError(f"{folder} holds only {', '.join(pickled)}: pickled weights, which can run code "
                             f"when opened, so they are never loaded here. Convert them to model.safetensors "
                             f"(for example with transformers: model.save_pretrained(folder, "
                             f"safe_serialization=True)).")
        raise ValueError(f"{folder} has no model.safetensors (the weights).")
    try:
        with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{folder}/config.json cannot be read as JSON: {err}") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{folder}/config.json does not hold a JSON object.")
    family = check_family(hf)
    tensors = _read_safetensors(os.path.join(folder, WEIGHTS_FILE))
    counted = sum(v.size for k, v in tensors.items() if v.dtype.kind == "f" and not k.endswith(BUFFERS)
                  and not k.startswith(HEADS_NOT_READ))
    if family == "bert":
        cfg, params = bert_format.params_from_bert(tensors, bert_format.config_from_bert(hf), dtype)
    else:
        cfg = config_from_gpt2(hf)
        params = params_from_gpt2(tensors, cfg, dtype)
    del tensors
    tokenizer = _read_tokenizer(folder, cfg) if TOKENIZER_FILE in files else None
    return Model(cfg, params, tokenizer, folder, family, counted)


def _read_tokenizer(folder: str, cfg: C.TransformerConfig):
    """``tokenizer.json`` without the padding and truncation it may carry (the page cuts texts
    itself), checked against the model's vocabulary."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(os.path.join(folder, TOKENIZER_FILE))
    except Exception as err:                         # the library raises a bare Exception
        raise ValueError(f"{folder}/tokenizer.json cannot be read: {err}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise ValueError(f"{folder}/tokenizer.json has {tokenizer.get_vocab_size():,} tokens but the model's "
                         f"embedding has {cfg.vocab_size:,} rows: the tokenizer belongs to another model.")
    return tokenizer


SAFETENSORS_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, each read straight into its own array.

    The format is an 8-byte little-endian header length, a JSON header ``{name: {dtype, shape,
    data_offsets}}``, then the raw bytes. Reading tensor by tensor (rather than the library's
    whole-file read, or a memory map whose pages also count) grows the process by the checkpoint's
    size once, not twice: what lets GPT-2 small fit a 1 GB app.
    """
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 + n:
                raise ValueError("the header runs past the end of the file")
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            start = 8 + n
            tensors = {}
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                if info["dtype"] not in SAFETENSORS_DTYPES:
                    raise ValueError(f"tensor {name} is {info['dtype']}; only F16, F32, F64, I32 and I64 are read")
                lo, hi = info["data_offsets"]
                value = np.empty(info["shape"], dtype=np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<"))
                if hi - lo != value.nbytes or start + hi > size:
                    raise ValueError(f"tensor {name} needs bytes {lo}..{hi}, past the end of the file")
                f.seek(start + lo)
                f.readinto(memoryview(value.reshape(-1)).cast("B"))
                tensors[name] = value
            return tensors
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a readable safetensors file (truncated or damaged?): {err}") from None


def _download(name: str, progress=None) -> str:
    """The Hub checkpoint's three files in huggingface_hub's cache; returns their folder."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ValueError("Loading by Hub name needs the huggingface_hub package (pip install huggingface_hub); "
                         "or give a folder with config.json, model.safetensors and tokenizer.json.") from None
    folder = None
    for k, filename in enumerate(HUB_FILES):
        if progress:
            progress(k / len(HUB_FILES), f"Downloading {name}/{filename}")
        try:
            folder = os.path.dirname(hf_hub_download(name, filename))
        except Exception as err:                         # offline, unknown repo, no such file: one message
            raise ValueError(
                f"Could not fetch {filename} of {name!r} from the Hugging Face Hub ({type(err).__name__}). "
                f"Without a network, put the checkpoint in a folder instead: config.json, model.safetensors "
                f"and tokenizer.json from https://huggingface.co/{name}/tree/main, and give that folder's "
                f"path.") from None
    if progress:
        progress(1.0, f"Downloaded {name}")
    return folder


def load(source: str, dtype=np.float32, *, progress=None) -> Model:
    """A GPT-2- or BERT-family checkpoint from a folder or a Hub name, ready to run.

    Parameters
    ----------
    source : a folder holding ``config.json``, ``model.safetensors`` and optionally
        ``tokenizer.json`` (read with no network call), or a Hub name (``"gpt2"``).
        ``"sentence-transformers/all-MiniLM-L6-v2"`` is read from its installed package
        (:mod:`core.model.minilm_package`), with no network call, and never downloaded.
    dtype : float32 or float64, the precision the model runs in.
    progress : optional ``progress(fraction, message)``, called while a Hub checkpoint downloads.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    if not isinstance(source, str) or not source.strip():
        raise ValueError("Give a folder path or a Hugging Face Hub name such as 'gpt2'.")
    source = os.path.expanduser(source.strip())
    if source == minilm_package.MINILM:
        return dataclasses.replace(_read_folder(minilm_package.minilm_folder(), dtype), source=source)
    if os.path.isdir(source):
        return _read_folder(source, dtype)
    if os.path.exists(source):
        raise ValueError(f"{source} is a file; give the folder that holds config.json and model.safetensors.")
    if source.startswith((".", "/", "~")) or os.sep in source.strip("/").replace("/", "", 1):
        raise ValueError(f"There is no folder {source}.")
    model = _read_folder(_download(source, progress), dtype)
    return dataclasses.replace(model, source=source)


def save(params: dict, config: C.TransformerConfig, folder: str, *, tokenizer=None) -> None:
    """Write ``config.json`` and ``model.safetensors`` (and ``tokenizer.json`` when a
    ``tokenizers.Tokenizer`` is given) in GPT-2's format, which ``transformers`` and :func:`load` read."""
    from safetensors.numpy import save_file

    hf = gpt2_config(config)
    tensors = gpt2_tensors(params, config)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf, f, indent=2)
    save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(os.path.join(folder, TOKENIZER_FILE))
