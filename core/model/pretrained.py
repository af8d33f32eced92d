"""Real models: checkpoints in the Hugging Face format, run on our own transformer.

A checkpoint is a folder with ``config.json``, ``model.safetensors`` and (optionally)
``tokenizer.json``; a Hub name (``gpt2``, ``distilgpt2``) is the same three files downloaded by
``huggingface_hub`` into its usual cache, and the packaged all-MiniLM-L6-v2 is read from its
installed package (:mod:`core.model.minilm_package`). Weights are read from safetensors only: a
pickled ``pytorch_model.bin`` can run code when it is opened, so it is never opened.

This module is what every family shares: finding and reading the files, the tokenizer, the model
object, writing. What a family's tensors are called and how they are laid out, and what its
``config.json`` says, is its format's business: one module per family in :mod:`core.model.formats`,
looked up by the config's ``model_type``.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from core.model import formats
from core.model import checkpoint_policy, hub, minilm_package, smollm2_package
from core.model.gguf import model as gguf_model
from core.model.layers import pack_weights
from core.model import transformer as tr
from core.model import config as C

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
HUB_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_gpt")   # the small GPT the app ships


# ----------------------------------------------------------------------------------------------
# a loaded model
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """A checkpoint ready to run: our config, our parameters (read-only) and its tokenizer.

    ``family`` is the checkpoint's ``model_type`` (``"gpt2"``, ``"bert"``, ...). A causal language
    model's ``forward`` returns logits, an encoder's (``is_encoder``) the last hidden states.
    ``checkpoint_params`` counts the numbers in the checkpoint's float tensors, as read
    from the file, that the model runs (not GPT-2's mask buffers, nor heads that are not run:
    BERT's pre-training heads, a saved copy of a tied unembedding).
    """

    config: C.TransformerConfig
    params: dict
    tokenizer: object | None = None          # a ``tokenizers.Tokenizer``, or None without tokenizer.json
    source: str = ""
    family: str = "gpt2"
    checkpoint_params: int = 0

    @property
    def is_encoder(self) -> bool:
        return not self.config.causal

    def encode(self, text: str) -> np.ndarray:
        """The token ids ``(T,)`` of ``text``, as the checkpoint's tokenizer cuts it (every id, even
        past the context: cutting is the caller's choice). A BERT-style tokenizer puts ``[CLS]`` in
        front and ``[SEP]`` at the end."""
        self._need_tokenizer()
        if not isinstance(text, str) or not text:
            raise ValueError("The text is empty: type something to run the model on.")
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def decode(self, ids) -> str:
        self._need_tokenizer()
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def tokens(self, ids) -> list[str]:
        """Each id as the text it stands for, for labels on the page: GPT-2's with its spaces (as
        itself), an encoder's word pieces as the vocabulary spells them (``[CLS]``, ``##ing``)."""
        self._need_tokenizer()
        if self.is_encoder:
            return [self.tokenizer.id_to_token(int(i)) for i in np.asarray(ids).reshape(-1)]
        return [self.tokenizer.decode([int(i)]) for i in np.asarray(ids).reshape(-1)]

    def token_id(self, token: str) -> int | None:
        """The id of a special token (``[CLS]``, ``<|endoftext|>``), or None when there is none."""
        return None if self.tokenizer is None else self.tokenizer.token_to_id(token)

    def forward(self, ids, **kwargs):
        """:func:`core.model.transformer.forward` on this model: ``(logits (B, T, V), cache)`` for
        GPT-2, ``(last_hidden_state (B, T, d), cache)`` for an encoder (``key_mask`` for padding)."""
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
    fmt = formats.for_config(hf)                         # its family's format, by model_type
    cfg = fmt.config_from(hf)                             # a variant we don't run stops here, unread
    tensors = _read_safetensors(os.path.join(folder, WEIGHTS_FILE))
    counted = sum(v.size for k, v in tensors.items() if v.dtype.kind == "f" and fmt.in_model(k))
    cfg, params = fmt.params_from(tensors, cfg, dtype)
    del tensors
    C.check_params(params, cfg)                           # every name and shape the config needs
    for value in params.values():
        value.setflags(write=False)                       # one copy, shared by every session
    # packed once for our own product; a tied unembedding reads the token table as E^T
    pack_weights(params, transposed=("embed",) if cfg.tied_unembed and cfg.head == "lm" else ())
    tokenizer = _read_tokenizer(folder, cfg) if TOKENIZER_FILE in files else None
    return Model(cfg, params, tokenizer, folder, fmt.MODEL_TYPE, counted)


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


def load(source: str, dtype=np.float32, *, progress=None) -> Model:
    """A checkpoint of a registered family (:mod:`core.model.formats`) from a folder or a Hub name,
    or a Llama-family GGUF file, ready to run.

    Parameters
    ----------
    source : a folder holding ``config.json``, ``model.safetensors`` and optionally
        ``tokenizer.json`` (read with no network call), or a Hub name (``"gpt2"``).
        ``"sentence-transformers/all-MiniLM-L6-v2"`` and ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` are
        read from their installed packages (:mod:`core.model.minilm_package`,
        :mod:`core.model.smollm2_package`) with no network call; without the package, from the Hub at a
        pinned commit, each file checked against its published sha256. Any other source is first held
        to the instructor's setting and the size cap (:mod:`core.model.checkpoint_policy`).
        A ``.gguf`` file (llama.cpp's format; family ``"llama"``: SmolLM2, Llama) is read in place,
        its quantised weights kept compact (:mod:`core.model.gguf`).
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
        folder = minilm_package.minilm_folder(allow_download=True, progress=progress)
        return dataclasses.replace(_read_folder(folder, dtype), source=source)
    if source == smollm2_package.SMOLLM2:
        return dataclasses.replace(_read_gguf(smollm2_package.smollm2_file(allow_download=True, progress=progress),
                                              dtype), source=source)
    if os.path.realpath(source) != os.path.realpath(SHIPPED):   # the app's own model is no checkpoint request
        checkpoint_policy.check_checkpoint_request(source)      # the instructor's setting and the size cap
    if os.path.isdir(source):
        return _read_folder(source, dtype)
    if os.path.isfile(source) and source.lower().endswith(".gguf"):
        return _read_gguf(source, dtype)
    if os.path.exists(source):
        raise ValueError(f"{source} is a file; give the folder that holds config.json and model.safetensors, "
                         f"or a .gguf file.")
    if source.startswith((".", "/", "~")) or os.sep in source.strip("/").replace("/", "", 1):
        raise ValueError(f"There is no folder {source}.")
    model = _read_folder(hub.download_checkpoint(source, HUB_FILES, progress), dtype)
    return dataclasses.replace(model, source=source)


def _read_gguf(path: str, dtype) -> Model:
    """A Llama-family GGUF file as a model, its quantised weights kept compact (:mod:`core.model.gguf`)."""
    gguf = gguf_model.read(path, dtype)
    return Model(gguf.config, gguf.params, gguf.tokenizer, path, gguf_model.FAMILY, gguf.checkpoint_params)


def save(params: dict, config: C.TransformerConfig, folder: str, *, tokenizer=None,
         model_type: str = "gpt2") -> None:
    """Write ``config.json`` and ``model.safetensors`` (and ``tokenizer.json`` when a
    ``tokenizers.Tokenizer`` is given) in the ``model_type`` family's format (GPT-2's, the one that is
    written), which ``transformers`` and :func:`load` read; a ValueError, with nothing written, when
    the model's architecture is not that family's."""
    from safetensors.numpy import save_file

    hf, tensors = formats.writer(model_type).to_checkpoint(params, config)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf, f, indent=2)
    save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save(os.path.join(folder, TOKENIZER_FILE))
