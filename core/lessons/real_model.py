"""Taking a real model apart: head detection, the logit lens, attention rollout, ablation, patching,
sentence similarity, what grouped-query attention saves, each a pure function of a model's config,
its parameters and the forward cache. Generation is :func:`core.model.generation.generate`, the one
for every causal model.

A real model's weights may be compact (:mod:`core.model.compact`: SmolLM2's quantised matrices): what
reads them here goes through :func:`~core.model.compact.wide`, and the unembedding, 49,152 tokens by
576 for SmolLM2, is read a slice of the vocabulary at a time, never widened whole.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.lessons import head_kinds as hs
from core.lessons import param_counts
from core.model import compact
from core.model import names
from core.model import norms as N
from core.model import transformer as tr
from core.model import config as C
from core.recording import recorded

HEAD_KINDS = ("previous-token", "duplicate-token", "induction", "first-token")
# A head is named as a kind when its score reaches this; the page states the thresholds.
THRESHOLDS = {"previous-token": 0.5, "next-token": 0.5, "[CLS] sink": 0.5, "[SEP] sink": 0.5, "broad": 0.85,
              "duplicate-token": 0.5, "induction": 0.3, "first-token": 0.5}


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending between words where the cut would split
    one (unless the first word alone is longer), trailing spaces dropped; shorter text unchanged."""
    if len(text) <= limit:
        return text
    kept = text[:limit]
    if not text[limit].isspace():                        # the cut falls inside a word: drop that word
        last_space = max((i for i, c in enumerate(kept) if c.isspace()), default=0)
        kept = kept[:last_space] or kept
    return kept.rstrip()


def fit_context(ids: np.ndarray, n_ctx: int, keep_last: bool = False) -> tuple[np.ndarray, int]:
    """The first ``n_ctx`` ids and how many were cut off (0 when the text fits); with ``keep_last``
    the last id (BERT's ``[SEP]``) stays at the end of a cut text."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("The text is empty: type something to run the model on.")
    cut = max(0, ids.size - n_ctx)
    if cut and keep_last:
        return np.append(ids[:n_ctx - 1], ids[-1]), cut
    return ids[:n_ctx], cut


@recorded
def stack_weights(cache: dict, n_layers: int, batch: int = 0) -> np.ndarray:
    """Every layer's attention weights of one sequence: ``(L, H, T, T)``."""
    return np.stack([w[batch] for w in names.per_block(cache, n_layers, "attn", "weights")])


# ----------------------------------------------------------------------------------------------
# the head detector, on repeated random tokens
# ----------------------------------------------------------------------------------------------
def repeated_random_tokens(vocab_size: int, n: int, *, batch: int = 4, seed: int = 0,
                           first: int | None = None) -> np.ndarray:
    """``(batch, n + n)`` (or ``1 + 2n`` with a ``first`` token in front): n random ids, then the same n again.

    In the second copy, position ``i`` holds the token of position ``i - n``: a duplicate-token
    head looks back there, an induction head one further, at ``i - n + 1``, the token that came
    next last time, which is the one to predict now.
    """
    if n < 2 or vocab_size < 2:
        raise ValueError("Repeated random tokens need n >= 2 and a vocabulary of at least 2 tokens.")
    r = np.random.default_rng(seed).integers(0, vocab_size, size=(batch, n))
    seq = np.concatenate([r, r], axis=1)
    if first is not None:
        seq = np.concatenate([np.full((batch, 1), first), seq], axis=1)
    return seq.astype(np.int64)


def head_scores(weights: np.ndarray, n: int, offset: int = 0) -> dict[str, np.ndarray]:
    """Each head's score as each kind, from attention weights ``(L, B, H, T, T)`` on
    :func:`repeated_random_tokens` (``offset`` = 1 when a first token precedes the two copies):

    - previous-token:  mean over queries ``i >= 1`` of ``A[i, i-1]``;
    - duplicate-token: mean over the second copy of ``A[i, i-n]`` (the same token, earlier);
    - induction:       mean over the second copy of ``A[i, i-n+1]`` (what followed it then);
    - first-token:     mean over every query of ``A[i, 0]`` (the "attention sink").

    Returns ``{kind: (L, H)}``, each score between 0 and 1.
    """
    A = np.asarray(weights)
    second = np.arange(offset + n, offset + 2 * n)                   # the queries of the second copy
    over_batch = lambda s: s.mean(axis=1)                            # noqa: E731  (L, B, H) -> (L, H)
    return {"previous-token": over_batch(hs.previous_token(A)),
            "duplicate-token": over_batch(hs.offset_back(A, second, n)),
            "induction": over_batch(hs.offset_back(A, second, n - 1)),
            "first-token": over_batch(hs.on_key(A, 0))}


@recorded
def detect_heads(params: dict, cfg: C.TransformerConfig, *, n: int = 20, batch: int = 4, seed: int = 0,
                 first: int | None = None) -> dict[str, np.ndarray]:
    """:func:`head_scores` of the model on repeated random tokens (``n`` at most half its context)."""
    n = min(n, (cfg.n_ctx - (first is not None)) // 2)
    seq = repeated_random_tokens(cfg.vocab_size, n, batch=batch, seed=seed, first=first)
    _, cache = tr.forward(params, cfg, seq, keep=("attn.weights",))
    W = np.stack(names.per_block(cache, cfg.n_layers, "attn", "weights"))               # (L, B, H, T, T)
    return head_scores(W, n, offset=int(first is not None))


@recorded
def sentence_head_scores(weights: np.ndarray) -> dict[str, np.ndarray]:
    """Each head's score as each kind an encoder has, from one sentence's weights ``(L, H, T, T)``
    (BERT's ``[CLS]`` first and ``[SEP]`` last):

    - previous-token: mean over queries ``i >= 1`` of ``A[i, i-1]``;
    - next-token:     mean over queries ``i < T-1`` of ``A[i, i+1]`` (only a bidirectional model can);
    - [CLS] sink:     mean over every query of ``A[i, 0]``;
    - [SEP] sink:     mean over every query of ``A[i, T-1]``;
    - broad:          mean over queries of the row's entropy over ``log2 T`` (1 = uniform).

    Returns ``{kind: (L, H)}``, each score between 0 and 1.
    """
    A = np.asarray(weights, dtype=np.float64)
    if A.shape[-1] < 3:
        raise ValueError("The head detector needs at least one word between [CLS] and [SEP].")
    return {"previous-token": hs.previous_token(A), "next-token": hs.next_token(A),
            "[CLS] sink": hs.on_key(A, 0), "[SEP] sink": hs.on_key(A, -1), "broad": hs.broad(A)}


@recorded
def sink_heads(scores: dict[str, np.ndarray], threshold: float = THRESHOLDS["[CLS] sink"]) -> int:
    """How many heads of :func:`sentence_head_scores` put on average at least ``threshold`` of their
    weight on ``[CLS]`` or on ``[SEP]``."""
    return int(((scores["[CLS] sink"] >= threshold) | (scores["[SEP] sink"] >= threshold)).sum())


# GPT-2 small under its Hub names, and the heads Wang et al. (2022, "Interpretability in the Wild", the
# indirect-object circuit) name in it by kind, as they write them: (layer, head) counted from 0.
GPT2_SMALL = ("gpt2", "openai-community/gpt2")
WANG_2022_GPT2_HEADS = {"previous-token": ((2, 2), (4, 11)), "induction": ((5, 5), (6, 9))}


@recorded
def published_heads(scores: dict[str, np.ndarray], published: dict = WANG_2022_GPT2_HEADS) -> list[dict]:
    """Each published head with the score it gets here as its kind: rows ``{kind, layer, head, score}``
    (layer and head counted from 0), in the order of ``published``."""
    return [{"kind": kind, "layer": l, "head": h, "score": float(scores[kind][l, h])}
            for kind, heads in published.items() for l, h in heads]


@recorded
def named_heads(scores: dict[str, np.ndarray], thresholds: dict = THRESHOLDS) -> list[dict]:
    """Every head whose score reaches its kind's threshold: rows ``{kind, layer, head, score}``
    (layer and head counted from 0), by kind, the highest score first."""
    rows = []
    for kind, s in scores.items():
        for l, h in zip(*np.nonzero(s >= thresholds[kind])):
            rows.append({"kind": kind, "layer": int(l), "head": int(h), "score": float(s[l, h])})
    return sorted(rows, key=lambda r: (list(scores).index(r["kind"]), -r["score"]))


# ----------------------------------------------------------------------------------------------
# sentence similarity: mean pooling on an encoder
# ----------------------------------------------------------------------------------------------
@recorded
def pad_batch(sequences: list, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Id sequences of any lengths as one batch ``(B, T)``, padded at the end with ``pad_id``, and
    the key mask ``(B, T)``: 1 for a token, 0 for padding."""
    T = max(len(s) for s in sequences)
    ids = np.full((len(sequences), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), T), dtype=np.int64)
    for b, s in enumerate(sequences):
        ids[b, :len(s)], mask[b, :len(s)] = s, 1
    return ids, mask


def mean_pool(hidden: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    r"""Each sequence's mean over its real tokens, L2-normalised: the sentence embedding ``(B, d)``.

    .. math:: e = \frac{\sum_t m_t x_t^{(L)}}{\sum_t m_t}, \qquad \hat e = e / \lVert e \rVert

    (:math:`x_t^{(L)}`: token t's vector after the last layer, ``hidden``; :math:`m_t`: the key mask.)
    """
    m = np.asarray(key_mask, dtype=np.float64)[..., None]                            # (B, T, 1)
    e = (np.asarray(hidden, dtype=np.float64) * m).sum(axis=1) / m.sum(axis=1)       # (B, d)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


@recorded
def similarity(params: dict, cfg: C.TransformerConfig, ids: np.ndarray, key_mask: np.ndarray,
               ablate: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sentence embeddings ``(B, d)`` of a padded batch and their cosine matrix ``(B, B)``
    (embeddings are unit vectors, so the cosine is their dot product), with heads edited by ``ablate``."""
    hidden, _ = tr.forward(params, cfg, ids, key_mask=key_mask, ablate=ablate)
    e = mean_pool(hidden, key_mask)
    return e, e @ e.T


# ----------------------------------------------------------------------------------------------
# the logit lens and attention rollout
# ----------------------------------------------------------------------------------------------
VOCAB_SLICE = 4096          # tokens of the unembedding read at a time by the logit lens


def unembedding_slices(params: dict, cfg: C.TransformerConfig, size: int = VOCAB_SLICE):
    """The unembedding a slice of the vocabulary at a time: ``(first, W (d, n), b (n,) or None)`` for
    tokens ``first .. first + n - 1``. Tied (GPT-2, SmolLM2), ``W`` is those tokens' embedding rows
    transposed, widened alone from a compact embedding; untied, columns of ``unembed``."""
    V = cfg.vocab_size
    bias = params.get("unembed_b")
    untied = None if cfg.tied_unembed else compact.wide(params["unembed"])           # (d, V)
    embed = params["embed"]
    for first in range(0, V, size):
        last = min(first + size, V)
        if untied is not None:
            W = untied[:, first:last]
        else:
            W = tr.token_rows(embed, np.arange(first, last)).T                       # (d, n)
        yield first, W, None if bias is None else bias[first:last]


@recorded
def logit_lens(params: dict, cfg: C.TransformerConfig, cache: dict, batch: int = 0,
               slice_size: int = VOCAB_SLICE):
    r"""The model's next-token guess at each position after each layer: the residual stream read
    through the model's own final norm (LayerNorm for GPT-2, RMSNorm for SmolLM2: ``cfg.norm``) and
    the unembedding, as if the later layers were not there.

    .. math:: z_\ell(t) = \mathrm{norm}_f\big(x_t^{(\ell)}\big)\, W_U, \qquad
              \text{guess} = \arg\max_v z_\ell(t)_v, \quad p = \frac{1}{\sum_v e^{z_v - \max z}}

    The vocabulary is read ``slice_size`` tokens at a time, keeping for each row the best token, its
    logit and the running sum of ``exp(z - best)`` (rescaled when the best grows), so the
    ``(L + 1, T, V)`` logits never exist at once: 61 MB for SmolLM2 on 10 tokens.

    Returns ``(top_ids, top_probs)``, each ``(L + 1, T)``: row 0 after the embeddings, row ``l``
    after block ``l - 1``; the last row is the model's own prediction.
    """
    streams = [x[batch] for x in names.per_block(cache, cfg.n_layers, "resid_pre")]
    streams.append(cache[names.key(names.block(cfg.n_layers - 1), "resid_post")][batch])
    x = np.stack(streams)                                             # (L+1, T, d)
    if cfg.final_ln:
        x = N.forward(cfg, x, params, "ln_final", {}, "ln_final")     # the model's own final norm
    rows = x.reshape(-1, x.shape[-1])                                 # ((L+1) T, d): one 2-D product a slice
    best = np.full(len(rows), -np.inf)                                # the largest logit so far, per row
    top = np.zeros(len(rows), dtype=np.int64)
    total = np.zeros(len(rows))                                       # sum of exp(z - best) so far
    for first, W, b in unembedding_slices(params, cfg, slice_size):
        z = (rows @ W if b is None else rows @ W + b).astype(np.float64)   # ((L+1) T, n)
        high = z.max(axis=-1)
        grown = np.maximum(best, high)
        total = total * np.exp(best - grown) + np.exp(z - grown[:, None]).sum(axis=-1)
        top = np.where(high > best, first + z.argmax(axis=-1), top)
        best = grown
    return top.reshape(x.shape[:2]), (1.0 / total).reshape(x.shape[:2])


@recorded
def rollout(weights: np.ndarray) -> np.ndarray:
    r"""Attention rollout (Abnar & Zuidema 2020) of weights ``(L, H, T, T)``: ``(L, T, T)``, row
    ``l`` how much each query draws on each input token through layers ``0..l``.

    .. math:: \bar A_l = \mathrm{rownorm}\big(\tfrac12 \mathrm{mean}_h A_{l,h} + \tfrac12 I\big), \qquad
              R_l = \bar A_l \bar A_{l-1} \cdots \bar A_0

    The identity stands for the residual connection, which carries each token past the attention.
    """
    A = np.asarray(weights, dtype=np.float64)
    T = A.shape[-1]
    mixed = 0.5 * A.mean(axis=1) + 0.5 * np.eye(T)                    # (L, T, T)
    mixed /= mixed.sum(axis=-1, keepdims=True)
    out = np.empty_like(mixed)
    R = np.eye(T)
    for l in range(len(mixed)):
        R = mixed[l] @ R
        out[l] = R
    return out


# ----------------------------------------------------------------------------------------------
# grouped-query attention: query heads sharing key/value heads, and what that saves
# ----------------------------------------------------------------------------------------------
def kv_heads(cfg: C.TransformerConfig) -> int:
    """How many key/value heads each layer has: ``n_kv_heads``, or one per query head (None)."""
    return cfg.n_heads if cfg.n_kv_heads is None else int(cfg.n_kv_heads)


@recorded
def query_heads_of(cfg: C.TransformerConfig) -> list[list[int]]:
    """For each key/value head ``g`` (from 0), the query heads that read it: ``h // (H / H_kv) = g``,
    so ``H / H_kv`` neighbours each. SmolLM2 (9 over 3): ``[[0, 1, 2], [3, 4, 5], [6, 7, 8]]``."""
    group = cfg.n_heads // kv_heads(cfg)
    return [list(range(g * group, (g + 1) * group)) for g in range(kv_heads(cfg))]


@dataclasses.dataclass(frozen=True)
class GroupedQuery:
    """What grouped-query attention weighs against full multi-head attention (one key/value head per
    query head) of the same ``d_model`` and ``H``: one layer's attention parameters, and the KV cache's
    bytes per token (the keys and values of every layer, at ``itemsize`` bytes a number)."""

    attention_params: int
    full_attention_params: int
    kv_bytes_per_token: int
    full_kv_bytes_per_token: int

    def kv_bytes(self, n_tokens: int) -> tuple[int, int]:
        """The KV cache's bytes after ``n_tokens`` positions: ``(grouped, full)``."""
        return n_tokens * self.kv_bytes_per_token, n_tokens * self.full_kv_bytes_per_token


@recorded
def grouped_query(cfg: C.TransformerConfig, itemsize: int = 4) -> GroupedQuery:
    r"""One layer's attention parameters and the KV cache per token, from the config:

    .. math:: \underbrace{d \cdot H d_k}_{W_Q} + \underbrace{2\, d \cdot H_{kv} d_k}_{W_K,\, W_V}
              + \underbrace{H d_k \cdot d}_{W_O} \quad\text{against}\quad 4 d^2, \qquad
              \text{KV bytes per token} = 2 \cdot L \cdot H_{kv} \cdot d_k \cdot \text{itemsize}

    (biases add ``H d_k + 2 H_kv d_k + d`` against ``4d``). SmolLM2 (d = 576, H = 9, H_kv = 3,
    d_k = 64, L = 30, float32): 884,736 against 1,327,104, and 46,080 bytes against 138,240.
    """
    d, H, H_kv, d_k = cfg.d_model, cfg.n_heads, kv_heads(cfg), cfg.d_k
    weights = d * H * d_k + 2 * d * H_kv * d_k + H * d_k * d
    biases = H * d_k + 2 * H_kv * d_k + d if cfg.bias else 0
    per_head = 2 * cfg.n_layers * d_k * itemsize                          # a key and a value in every layer
    return GroupedQuery(weights + biases, param_counts.mha_param_count(d, H, cfg.bias),
                        H_kv * per_head, H * per_head)


# ----------------------------------------------------------------------------------------------
# ablation and patching: how the next-token probabilities move
# ----------------------------------------------------------------------------------------------
def next_token_probs(logits: np.ndarray) -> np.ndarray:
    """Softmax of the last position's logits ``(V,)``, in float64."""
    z = np.asarray(logits[0, -1], dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


@recorded
def head_edit(cache: dict, layer: int, head: int, how: str, other_cache: dict | None = None):
    """The edit :func:`transformer.forward` takes for one head: ``"zero"``, ``"mean"``, or
    ``"patch"``: the head's output on the second prompt. Prompts of different lengths are aligned
    at their ends, so the last position, whose next token is measured, always takes the second
    prompt's last; earlier positions without a partner keep their own output."""
    if how in ("zero", "mean"):
        return {(layer, head): how}
    if how != "patch" or other_cache is None:
        raise ValueError("A head is changed by 'zero', 'mean' or 'patch' (patching needs a second prompt).")
    entry = names.key(names.block(layer), "attn", "head_outputs")
    own, theirs = cache[entry][0, head], other_cache[entry][0, head]      # (T, d_k) each
    value = own.copy()
    n = min(len(own), len(theirs))
    value[len(own) - n:] = theirs[len(theirs) - n:]
    return {(layer, head): value}


@recorded
def resumed_logits(params: dict, cfg: C.TransformerConfig, cache: dict, layer: int, edit: dict) -> np.ndarray:
    """The last position's logits ``(B, V)`` with ``edit`` applied, the forward pass resumed at block
    ``layer`` from the residual stream the unedited pass left in ``cache`` there: an edit of a head in
    layer ``l`` changes nothing before block ``l``, so blocks ``0 .. l-1`` need not run again (and only
    the last position, whose next token is measured, goes through the unembedding)."""
    h = cache[names.key(names.block(layer), "resid_pre")]                           # (B, T, d)
    tuned = tr.runs_tuned(cfg, h.dtype)
    for i in range(layer, cfg.n_layers):
        h = tr.block(h, tr.block_params(params, names.block(i) + "."), cfg, {}, names.block(i), edits=edit,
                     layer=i, tuned=tuned)
    return tr.unembed(params, cfg, h[:, -1:], {})[:, 0]


@recorded
def edit_effect(params: dict, cfg: C.TransformerConfig, ids: np.ndarray, logits: np.ndarray, edit: dict,
                top: int = 8, cache: dict | None = None) -> list[dict]:
    """The most likely next tokens before and after an edit, most changed first:
    rows ``{id, before, after, change}``. With the unedited pass's ``cache``, the edited pass resumes
    at the first edited layer (:func:`resumed_logits`) instead of running from the start."""
    if cache is None:
        after_logits, _ = tr.forward(params, cfg, ids, ablate=edit)
    else:
        after_logits = resumed_logits(params, cfg, cache, min(l for l, _ in edit), edit)[:, None]   # (B, 1, V)
    before, after = next_token_probs(logits), next_token_probs(after_logits)
    change = after - before
    picks = np.unique(np.concatenate([np.argsort(-before)[:top // 2], np.argsort(-np.abs(change))[:top]]))
    picks = picks[np.argsort(-np.abs(change[picks]), kind="stable")][:top]
    return [{"id": int(t), "before": float(before[t]), "after": float(after[t]), "change": float(change[t])}
            for t in picks]


# ----------------------------------------------------------------------------------------------
# tokens as text: a byte-level tokenizer's tokens as their bytes
# ----------------------------------------------------------------------------------------------
def _gpt2_byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each of the 256 bytes
    in its vocabulary's token strings (printable bytes stand for themselves; the space is ``Ġ``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = printable + [256 + i for i in range(len(others))]
    return {chr(c): b for b, c in zip(printable + others, chars)}


BYTE_OF = _gpt2_byte_alphabet()


def is_byte_level(tokenizer) -> bool:
    """Whether ``tokenizer`` (a ``tokenizers.Tokenizer``) cuts bytes, not characters, as GPT-2's does."""
    from tokenizers import decoders

    return isinstance(getattr(tokenizer, "decoder", None), decoders.ByteLevel)


def bytes_as_text(data: bytes) -> str:
    """``data`` as UTF-8 text, every byte that is not part of a whole character written ``<0xF0>``."""
    text = data.decode("utf-8", errors="surrogateescape")       # a stray byte b becomes U+DC00 + b
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def _token_bytes(tokenizer, i: int) -> bytes:
    """The bytes a byte-level tokenizer's token ``i`` stands for; a token spelled outside its byte
    alphabet (an added one) as its own spelling in UTF-8."""
    token = tokenizer.id_to_token(int(i))
    if token is None:
        return tokenizer.decode([int(i)]).encode("utf-8")
    if any(c not in BYTE_OF for c in token):
        return token.encode("utf-8")
    return bytes(BYTE_OF[c] for c in token)


@recorded
def token_texts(model, ids) -> list[str]:
    """Each id as the text it stands for, for the page's labels. A byte-level tokenizer's token
    holds bytes, and a character of several UTF-8 bytes (an emoji, an Arabic letter) may be split
    between tokens: such a token shows its bytes (``<0xF0><0x9F>``), not the "�" its decoding gives."""
    if model.is_encoder or not is_byte_level(model.tokenizer):
        return model.tokens(ids)
    return [bytes_as_text(_token_bytes(model.tokenizer, i)) for i in np.asarray(ids).reshape(-1)]


def text_of(model, ids) -> str:
    """The text of a run of ids, for the page: a byte-level tokenizer's bytes joined, then read as
    UTF-8, a byte that completes no character shown as ``<0xD9>`` (where decoding gives "�")."""
    if model.is_encoder or not is_byte_level(model.tokenizer):
        return model.decode(ids)
    return bytes_as_text(b"".join(_token_bytes(model.tokenizer, i) for i in np.asarray(ids).reshape(-1)))


def has_partial_character(texts) -> bool:
    """Whether any of :func:`token_texts` holds part of a character (written as its bytes)."""
    return any("<0x" in t for t in texts)


def multibyte_characters(text: str, most: int = 3) -> list[tuple[str, str]]:
    """The first ``most`` distinct characters of ``text`` that take more than one byte in UTF-8, each
    with its bytes in hex: ``[("é", "C3 A9"), ...]``."""
    seen = []
    for c in text:
        if len(c.encode("utf-8")) > 1 and c not in (s for s, _ in seen):
            seen.append((c, c.encode("utf-8").hex(" ").upper()))
            if len(seen) == most:
                break
    return seen


def parameter_count(params: dict) -> int:
    """How many numbers a model's parameters hold: the sum of its arrays' sizes (a compact weight
    counts the numbers it widens to)."""
    return int(sum(p.size for p in params.values()))
