"""Generation one token at a time, through a KV cache (or recomputing the whole prefix each step),
for every causal model: the tiny decoders (:mod:`core.model.decoder`) and a real model's
:class:`~core.model.config.TransformerConfig` and parameters (GPT-2).

Each step is the one transformer's forward pass (:mod:`core.model.transformer`; an
encoder-decoder's decoder stack, :func:`core.model.transformer_encdec.decode`). With
``use_cache=True`` the prompt runs through the decoder once (filling the KV cache), then each new
token runs alone, its query attending over the cached keys and values of every earlier position:
O(T) work per token. With ``use_cache=False`` every step recomputes the full causal forward pass
over the whole prefix, O(T^2) work per token, and gives the same logits.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import config, names, sampling, transformer, transformer_encdec
from core.model import params as P
from core.model.transformer_encdec import EncoderDecoderConfig, target_stack
from core.recording import recorded


@recorded
def attention_weights(cache: dict, cfg, sublayer: str = "attn", query: int | None = None) -> np.ndarray:
    """Every decoder block's attention weights from a forward cache, stacked: ``(L, B, H, T, Tk)``,
    or with ``query`` (an index) only that query's row of each, ``(L, B, H, Tk)``: generation reads
    the last row at every step and need not copy the others. ``sublayer`` is ``"attn"`` (the masked
    self-attention) or ``"cross"`` (an encoder-decoder's cross-attention, ``Tk = S``)."""
    cross = isinstance(cfg, EncoderDecoderConfig)
    stack, n_layers = ("dec.", cfg.decoder.n_layers) if cross else ("", cfg.n_layers)
    weights = names.per_block(cache, n_layers, sublayer, "weights", stack=stack)
    return np.stack(weights if query is None else [w[:, :, query] for w in weights])


def _run(params: dict, cfg, tokens: np.ndarray, memory, kv: list | None, start: int):
    """The decoder on ``tokens (B, n)``, the positions ``start..start+n-1``: ``(logits (B, n, V), cache)``.

    The one transformer's forward pass (the decoder stack of an encoder-decoder, reading the encoder's
    ``memory``). With ``kv`` (one dict per block) each block appends the new positions' keys and
    values to its cache and their queries attend over every cached position, causally among the
    new ones (:func:`core.model.multi_head.attend`).
    """
    if isinstance(cfg, EncoderDecoderConfig):
        cache = {}
        return transformer_encdec.decode(params, cfg, tokens, memory, cache, kv=kv, start=start), cache
    return transformer.forward_checked(params, cfg, tokens, kv=kv, start=start,   # checked once, by generate
                                       keep=("attn.weights",))                # all a step reads of the cache


@dataclasses.dataclass
class Generation:
    """What :func:`generate` produced, step by step (``n`` steps, one new token each).

    Shapes are for one sequence. For a batch, ``B`` leads every array (in ``self_attn``, each
    step's array) except ``cache_sizes`` and ``positions_computed``, which all sequences share.

    Attributes
    ----------
    tokens : (P + n,) the prompt, then the new tokens
    prompt_len : P
    step_logits : (n, V) the logits each new token was drawn from
    step_probs : (n, V) the sampler's distribution after temperature, top-k and top-p (zero outside
        ``allowed``)
    allowed : (n, V) bool, the tokens the sampler was allowed to pick
    cache_sizes : (n,) rows in the KV cache after the step's forward pass (the positions its keys
        and values cover); 0 without the cache
    positions_computed : (n,) positions run through the decoder at each step: the prompt and then
        one per step with the cache, the whole prefix every step without it
    self_attn : n arrays (L, H, P + s): step s's new query's causal self-attention row, per layer and head
    cross_attn : (n, L, H, S) the new query's cross-attention row (encoder-decoder only, else None)
    keys, values : (L, H_kv, P + n - 1, d_k) the KV cache at the end (None without the cache): the
        model's key/value heads (``H_kv = H`` unless it shares them, grouped-query attention), with
        rotary positions the keys as turned; at step s it held the first ``cache_sizes[s]`` rows
    """

    tokens: np.ndarray
    prompt_len: int
    step_logits: np.ndarray
    step_probs: np.ndarray
    allowed: np.ndarray
    cache_sizes: np.ndarray
    positions_computed: np.ndarray
    self_attn: list
    cross_attn: np.ndarray | None
    keys: np.ndarray | None
    values: np.ndarray | None

    @property
    def new_tokens(self) -> np.ndarray:
        return self.tokens[..., self.prompt_len:]


def _check_generation_inputs(cfg, src, prompt, max_new_tokens):
    """Checked ``(src (B, S) or None, prompt (B, P))``, and whether one sequence was given."""
    if not P.whole(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}.")
    single, stack, bos_id = True, cfg, None
    if isinstance(cfg, EncoderDecoderConfig):
        if src is None:
            raise ValueError("This encoder-decoder needs a source sequence (src) to generate from.")
        single, stack, bos_id = np.ndim(src) == 1, cfg.decoder, cfg.bos_id
        src = P.check_tokens(src, cfg.encoder.vocab_size, cfg.encoder.n_ctx, "The source")
    elif not cfg.causal or cfg.head != "lm":
        raise ValueError("Only a causal language model (causal=True, head='lm') generates text.")
    elif src is not None:
        raise ValueError("This is a decoder-only model: it takes no source; give a prompt instead.")
    if prompt is None:
        if bos_id is None:
            raise ValueError("Give a prompt of at least one token: this model has no start token "
                             "(bos_id) to begin from.")
        prompt = [bos_id]
    if np.ndim(prompt) == 2:
        single = False
    n_ctx = stack.n_ctx
    prompt = P.check_tokens(prompt, stack.vocab_size, n_ctx, "The prompt")           # refuses an empty one
    B = src.shape[0] if src is not None else prompt.shape[0]
    if prompt.shape[0] == 1 and B > 1:
        prompt = np.repeat(prompt, B, axis=0)                                # one prompt for every source
    if prompt.shape[0] != B:
        raise ValueError(f"The prompt has {prompt.shape[0]} rows and the source {B}.")
    n_prompt = prompt.shape[1]
    if n_prompt + max_new_tokens - 1 > n_ctx:
        raise ValueError(f"A prompt of {n_prompt} tokens plus {max_new_tokens} new ones needs a context of "
                         f"{n_prompt + max_new_tokens - 1} positions; this model reads at most {n_ctx}. "
                         f"Ask for at most {n_ctx - n_prompt + 1} new tokens.")
    return src, prompt, single


@recorded
def generate(params: dict, cfg, src=None, *, prompt=None, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             use_cache: bool = True, seed: int = 0) -> Generation:
    """Generate ``max_new_tokens`` tokens one at a time, each drawn from the model's next-token
    distribution and appended to the input of the next step.

    Parameters
    ----------
    params : dict in the one vocabulary
    cfg : TransformerConfig (a causal language model: a decoder-only model, GPT-2) or
        EncoderDecoderConfig
    src : (S,) or (B, S) int, encoder-decoder only
        The source. Its encoder output is computed once and serves every step.
    prompt : (P,) or (B, P) int, optional
        The tokens to continue; a single prompt serves every source of a batch. Default: an
        encoder-decoder's ``[cfg.bos_id]``; a decoder-only model has no start token and needs a
        prompt of at least one token. ``P + max_new_tokens - 1 <= n_ctx``: the last new token is
        never read, so it needs no position.
    max_new_tokens : int >= 1
    temperature, top_k, top_p : the sampler (see :mod:`core.model.sampling`); ``temperature=0`` is
        greedy decoding
    use_cache : bool
        True: the prompt runs once, then each step runs only the new token, attending over the KV
        cache. False: each step recomputes the full causal forward pass over the whole prefix.
        Both give the same logits (to rounding) and, for a seed, the same tokens.
    seed : int
        Seeds this call's own ``numpy.random.Generator`` (the global state is never used).

    Returns
    -------
    Generation
    """
    # names, shapes and dtype, not finiteness: the forward pass refuses non-finite activations
    dtype = config.check_params(params, transformer_encdec.param_shapes(cfg)
                                if isinstance(cfg, EncoderDecoderConfig) else cfg)
    settings = sampling.SamplerSettings(temperature, top_k, top_p)
    src, prompt, single = _check_generation_inputs(cfg, src, prompt, max_new_tokens)
    rng = np.random.default_rng(seed)
    B, n_prompt = prompt.shape
    stack = target_stack(cfg)
    n, Lr, H, V = int(max_new_tokens), stack.n_layers, stack.n_heads, stack.vocab_size

    # the encoder runs once: its output serves every step
    memory = None if src is None else transformer_encdec.encode(params, cfg, src, {})
    kv = [{} for _ in range(Lr)] if use_cache else None           # each block's keys and values so far

    tokens = np.concatenate([prompt, np.zeros((B, n), dtype=np.int64)], axis=1)
    step_logits = np.zeros((B, n, V), dtype=dtype)
    step_probs = np.zeros((B, n, V))
    allowed = np.zeros((B, n, V), dtype=bool)
    cache_sizes = np.zeros(n, dtype=np.int64)
    computed = np.zeros(n, dtype=np.int64)
    self_rows = []
    cross_rows = np.zeros((B, n, Lr, H, src.shape[1]), dtype=dtype) if memory is not None else None
    for s in range(n):
        t = n_prompt + s                                            # positions read at this step
        # 1. the logits of the next token, from the last position
        cached = kv[0]["K"].shape[2] if use_cache and kv[0] else 0  # positions already in the KV cache
        new = tokens[:, cached:t]                                   # with the cache: the prompt, then one token
        logits, cache = _run(params, cfg, new, memory, kv, cached)
        computed[s] = new.shape[1]
        cache_sizes[s] = t if use_cache else 0
        # the last position's attention rows, (B, L, H, t) and (B, L, H, S)
        self_rows.append(attention_weights(cache, cfg, query=-1).transpose(1, 0, 2, 3))
        if cross_rows is not None:
            cross_rows[:, s] = attention_weights(cache, cfg, "cross", query=-1).transpose(1, 0, 2, 3)
        step_logits[:, s] = logits[:, -1]
        # 2. the sampler picks each sequence's next token
        for b in range(B):
            tokens[b, t], step_probs[b, s], allowed[b, s] = sampling.sample(step_logits[b, s], settings, rng)

    keys = values = None
    if use_cache:
        keys = np.stack([block["K"] for block in kv], axis=1)      # (B, L, H, P + n - 1, d_k)
        values = np.stack([block["V"] for block in kv], axis=1)
    out = Generation(tokens, n_prompt, step_logits, step_probs, allowed, cache_sizes, computed,
                     self_rows, cross_rows, keys, values)
    if single:
        for field in ("tokens", "step_logits", "step_probs", "allowed", "cross_attn", "keys", "values"):
            value = getattr(out, field)
            if value is not None:
                setattr(out, field, value[0])
        out.self_attn = [row[0] for row in out.self_attn]
    return out
