"""The tokenizer a GGUF file describes, built as a ``tokenizers.Tokenizer``.

A GGUF has no ``tokenizer.json``; it keeps the tokenizer as metadata under llama.cpp's names::

    tokenizer.ggml.model        "gpt2": byte-level BPE (GPT-2's kind; SmolLM2, Llama 3)
    tokenizer.ggml.pre          how text is cut into words before the merges ("smollm", "llama-bpe", ...)
    tokenizer.ggml.tokens       the vocabulary, id by id, spelled in GPT-2's byte alphabet ("Ġthe")
    tokenizer.ggml.merges       the BPE merges, best first, each "left right"
    tokenizer.ggml.token_type   1 normal, 3 control (<|im_start|>: special), 4 user-defined, ...
    tokenizer.ggml.bos_token_id / eos_token_id, add_bos_token

Control tokens are added as special tokens (kept whole in a text, left out of a decoded one), as
transformers does when it reads a GGUF.
"""
from __future__ import annotations

import numpy as np

CONTROL, USER_DEFINED = 3, 4

# Llama 3's words ("llama-bpe"): GPT-2's, but numbers cut in threes and line breaks kept together
LLAMA3_WORDS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def pre_tokenizer(name: str):
    """The pre-tokenizer ``tokenizer.ggml.pre`` names, as the ``tokenizers`` steps that cut text as
    llama.cpp does; a ValueError listing those known here."""
    from tokenizers import Regex, pre_tokenizers as pt

    gpt2_words = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    steps = {
        "default": lambda: gpt2_words,
        "gpt2": lambda: gpt2_words,
        # SmolLM's (StarCoder's): every digit alone, then GPT-2's words
        "smollm": lambda: pt.Sequence([pt.Digits(individual_digits=True), gpt2_words]),
        "llama-bpe": lambda: pt.Sequence([pt.Split(Regex(LLAMA3_WORDS), behavior="isolated"),
                                          pt.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    steps["llama3"] = steps["llama-v3"] = steps["llama-bpe"]
    if name not in steps:
        raise ValueError(f"The file's tokenizer cuts text with llama.cpp's {name!r} pre-tokenizer, which is not "
                         f"known here (known: {', '.join(sorted(steps))}).")
    return steps[name]()


def tokenizer_from(metadata: dict, vocab_size: int):
    """The file's tokenizer as a ``tokenizers.Tokenizer``, checked against the model's ``vocab_size``
    (its embedding's rows); a ValueError when it is not byte-level BPE or does not fit the model."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"The file's tokenizer is {kind or 'not given'!r}; only byte-level BPE "
                         f"(tokenizer.ggml.model 'gpt2', as SmolLM2 and Llama 3 use) is read here.")
    tokens = _need(metadata, "tokenizer.ggml.tokens")
    merges = _need(metadata, "tokenizer.ggml.merges")
    if len(tokens) != vocab_size:
        raise ValueError(f"The file's tokenizer has {len(tokens):,} tokens but the model's embedding has "
                         f"{vocab_size:,} rows: the tokenizer does not belong to these weights.")
    kinds = np.asarray(metadata.get("tokenizer.ggml.token_type", np.ones(len(tokens))))
    if kinds.shape != (len(tokens),):
        raise ValueError(f"tokenizer.ggml.token_type has {kinds.size:,} entries for {len(tokens):,} tokens.")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("The file's vocabulary spells some token twice; it cannot be a BPE vocabulary.")
    pairs = [_merge(m, vocab, k) for k, m in enumerate(merges)]

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tokenizer.pre_tokenizer = pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, k in zip(tokens, kinds) if k == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, k in zip(tokens, kinds) if k == USER_DEFINED])
    if metadata.get("tokenizer.ggml.add_bos_token", False):
        bos = _special(metadata, "bos", tokens)
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return tokenizer


def _need(metadata: dict, key: str):
    if key not in metadata:
        raise ValueError(f"The file's metadata has no {key}, which its tokenizer needs.")
    return metadata[key]


def _merge(merge, vocab: dict, k: int) -> tuple[str, str]:
    """Merge ``k`` ("left right") as a pair of tokens that are in the vocabulary, as is their join."""
    parts = merge.split(" ") if isinstance(merge, str) else ()
    if len(parts) != 2 or any(p not in vocab for p in parts) or parts[0] + parts[1] not in vocab:
        raise ValueError(f"Merge {k} of the file's tokenizer, {merge!r}, names a token the vocabulary does not "
                         f"have: the merges do not belong to this vocabulary.")
    return parts[0], parts[1]


def _special(metadata: dict, which: str, tokens: list) -> str:
    """The text of the ``which`` ("bos", "eos") token."""
    i = _need(metadata, f"tokenizer.ggml.{which}_token_id")
    if not 0 <= i < len(tokens):
        raise ValueError(f"tokenizer.ggml.{which}_token_id is {i}, outside the vocabulary's {len(tokens):,} ids.")
    return tokens[i]
