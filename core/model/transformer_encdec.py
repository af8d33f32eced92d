"""The encoder-decoder, built from the one transformer's blocks, with its hand-written backward pass::

    memory = the encoder stack on the source ids src (B, S): embed, positions, blocks with no mask
    x = dec.embed[tgt_in] + positions                                          # (B, T, d)
    per decoder block i, post-norm:  x = LN1(x + MHA(x, causal))
                                     x = LN_cross(x + MHA(x, over memory))      # cross-attention
                                     x = LN2(x + FFN(x))
                         pre-norm:   x = x + MHA(LN1(x));  x = x + MHA(LN_cross(x), memory);  x = x + FFN(LN2(x))
    logits = LN_final(x) @ unembed + unembed_b                                 # (B, T, V)

Cross-attention takes its queries from the decoder and its keys and values from the encoder's
output. Names, in the one vocabulary with the two stacks prefixed: ``enc.embed``, ``enc.pos``,
``enc.blocks.{i}.*``, ``dec.embed``, ``dec.pos``, ``dec.blocks.{i}.*``, plus
``dec.blocks.{i}.cross.W_Q ... b_O`` and ``dec.blocks.{i}.ln_cross.g|b``; the output ``unembed``,
``unembed_b`` (``ln_final.g|b``). The cache adds ``dec.blocks.{i}.cross.scores|weights|
head_outputs|concat|output``, ``dec.blocks.{i}.ln_cross.mean|std``, ``dec.blocks.{i}.resid_cross``
and ``memory`` to the transformer's entries under the same prefixes.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from core.model import config as C
from core.model import layers as L
from core.model import multi_head as MH
from core.model import names
from core.model import norms as N
from core.model import params as P
from core.model import transformer as tr
from core.model import transformer_backward as tb
from core.model.config import TransformerConfig
from core.model.names import key


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig:
    """The source stack's settings (``encoder``: no mask; its head settings are unused) and the
    target stack's and output's (``decoder``: causal, a language-model head). ``bos_id``, optional,
    is the start token generation begins with when given no prompt."""

    encoder: TransformerConfig
    decoder: TransformerConfig
    bos_id: int | None = None

    def __post_init__(self):
        e, d = self.encoder, self.decoder
        if e.d_model != d.d_model or e.n_heads != d.n_heads or e.ln_eps != d.ln_eps:
            raise ValueError("The encoder and the decoder must share d_model, n_heads and ln_eps.")
        if e.causal or not d.causal or d.head != "lm" or d.tied_unembed:
            raise ValueError("The encoder reads its whole source (causal=False); the decoder is causal, with "
                             "head='lm' and its own unembedding (tied_unembed=False).")
        if self.bos_id is not None and not (P.whole(self.bos_id) and 0 <= self.bos_id < d.vocab_size):
            raise ValueError(f"bos_id must be a token id in 0..{d.vocab_size - 1} (or None), got {self.bos_id!r}.")


def target_stack(cfg) -> TransformerConfig:
    """The stack that reads the target: an encoder-decoder's decoder, or a decoder-only model itself."""
    return cfg.decoder if isinstance(cfg, EncoderDecoderConfig) else cfg


def _in_stack(name: str, prefix: str) -> bool:
    return name in (f"{prefix}embed", f"{prefix}pos") or name.startswith(f"{prefix}blocks.")


def cross_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """One decoder block's cross-attention sublayer, under its short names."""
    d = cfg.d_model
    shapes = {f"cross.{w}": (d, d) for w in ("W_Q", "W_K", "W_V", "W_O")}
    if cfg.bias:
        shapes.update({f"cross.{b}": (d,) for b in ("b_Q", "b_K", "b_V", "b_O")})
    return {**shapes, **C.norm_shapes(cfg, "ln_cross")}


def param_shapes(cfg: EncoderDecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter with its shape: the encoder stack, the decoder stack, the output."""
    shapes = {n: s for n, s in C.param_shapes(cfg.encoder, "enc.").items() if _in_stack(n, "enc.")}
    ln1_last = list(C.norm_shapes(cfg.decoder, "ln1"))[-1]                  # ln1.b (LayerNorm), ln1.g (RMSNorm)
    for name, shape in C.param_shapes(cfg.decoder, "dec.").items():
        shapes[name if _in_stack(name, "dec.") else name.removeprefix("dec.")] = shape    # the output unprefixed
        if name.startswith("dec.blocks.") and name.endswith("." + ln1_last):   # cross-attention runs after ln1
            block = name.removesuffix(ln1_last)
            shapes.update({block + short: s for short, s in cross_shapes(cfg.decoder).items()})
    return shapes


def init_params(cfg: EncoderDecoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters, as :func:`C.init_params` draws them."""
    return P.init_by_name(param_shapes(cfg), seed, dtype)


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
def decoder_block(x, memory, p: dict, cfg: TransformerConfig, cache: dict, name: str, *,
                  kv: dict | None = None, start: int = 0, tuned: bool = False) -> np.ndarray:
    """One decoder block: :func:`transformer.block` with the cross-attention sublayer after its
    self-attention (``{name}.resid_cross`` is the residual stream after it). ``kv`` and ``start``:
    the self-attention's KV cache, as in :func:`core.model.multi_head.attend`."""
    sub, w = {}, MH.weights(p, "cross")

    def cross_attention(a):                               # queries from the decoder, keys and values from the memory
        return MH.attend(a, memory, w, cfg, cache, key(name, "cross"), tuned=tuned)

    def ffn(a):
        return tr.feed_forward(a, p, cfg, cache, key(name, "ffn"), tuned=tuned)

    def norm(part):
        return lambda a: N.forward(cfg, a, p, part, cache, key(name, part))

    # 1. masked self-attention (and its norm): the transformer's own first sublayer
    one = dataclasses.replace(cfg, d_ff=0)                                   # a block with only its attention
    x = tr.block(x, p, one, sub, name, kv=kv, start=start, tuned=tuned)
    cache.update({k: v for k, v in sub.items() if not k.endswith(".resid_post")})
    # 2. cross-attention: post-norm x = LN_cross(x + MHA(x, memory));  pre-norm x = x + MHA(LN_cross(x), memory)
    x = N.residual(x, cross_attention, norm("ln_cross"), cfg.norm_placement)
    cache[key(name, "resid_cross")] = x
    # 3. feed-forward (and its norm), as in every block
    if cfg.d_ff:
        x = N.residual(x, ffn, norm("ln2"), cfg.norm_placement)
    cache[key(name, "resid_post")] = x
    return x


def encode(params: dict, cfg: EncoderDecoderConfig, src: np.ndarray, cache: dict, *,
           tuned: bool | None = None) -> np.ndarray:
    """The encoder stack on checked source ids ``src (B, S)``: its output, the memory ``(B, S, d)``.
    ``tuned``: the choice of :func:`forward_checked` (None: this call makes it,
    :func:`core.model.transformer.runs_tuned`)."""
    if tuned is None:
        tuned = tr.runs_tuned(cfg.encoder, params["enc.embed"].dtype)
    m = tr.embed(params, cfg.encoder, src, prefix="enc.", cache=cache)                    # (B, S, d)
    for i in range(cfg.encoder.n_layers):
        name = names.block(i, "enc.")
        m = tr.block(m, tr.block_params(params, name + "."), cfg.encoder, cache, name, tuned=tuned)
    cache["memory"] = m
    return m


def decode(params: dict, cfg: EncoderDecoderConfig, tgt: np.ndarray, memory: np.ndarray, cache: dict, *,
           kv: list | None = None, start: int = 0, tuned: bool | None = None) -> np.ndarray:
    """The decoder stack on checked ids ``tgt (B, T)`` at positions ``start..start+T-1``, reading the
    memory in every block: ``logits (B, T, V)``. ``kv``: one dict per block, its self-attention's
    KV cache (see :func:`transformer.forward`); ``tuned`` as in :func:`encode`."""
    if tuned is None:
        tuned = tr.runs_tuned(cfg.decoder, params["dec.embed"].dtype)
    x = tr.embed(params, cfg.decoder, tgt, start, prefix="dec.", cache=cache)             # (B, T, d)
    for i in range(cfg.decoder.n_layers):
        name = names.block(i, "dec.")
        x = decoder_block(x, memory, tr.block_params(params, name + "."), cfg.decoder, cache, name,
                          kv=None if kv is None else kv[i], start=start, tuned=tuned)
    cache["dec.final"] = x
    cache["logits"] = logits = tr.unembed(params, cfg.decoder, x, cache)     # (B, T, V)
    return logits


def forward(params: dict, cfg: EncoderDecoderConfig, src, tgt_in):
    """Teacher-forced forward pass: ``(logits (B, T, V), cache)`` (names in the module docstring)."""
    C.check_params(params, param_shapes(cfg), finite=True)
    return forward_checked(params, cfg, src, tgt_in)


def forward_checked(params: dict, cfg: EncoderDecoderConfig, src, tgt_in):
    """:func:`forward` for parameters the caller has already checked (as
    :func:`core.model.transformer.forward_checked`); the tokens are checked here."""
    src, tgt = C.check_tokens(src, cfg.encoder), C.check_tokens(tgt_in, cfg.decoder)
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"The source has {src.shape[0]} sequences and the target {tgt.shape[0]}.")
    cache = {"enc.tokens": src, "tokens": tgt}
    tuned = tr.runs_tuned(cfg.decoder, params["dec.embed"].dtype)           # the readable steps or their tuned twins
    memory = encode(params, cfg, src, cache, tuned=tuned)                   # 1. the encoder stack
    return decode(params, cfg, tgt, memory, cache, tuned=tuned), cache      # 2. the decoder stack reading it


# ----------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------
def decoder_block_backward(dx, p: dict, cfg: TransformerConfig, cache: dict, name: str):
    """``(d input, d memory, grads)`` of :func:`decoder_block`, in reverse, from its cache."""
    g, w, d_memory = {}, MH.weights(p, "cross"), None

    def cross_attention_backward(d_out):     # the queries' share goes back to x, the keys' and values' to the memory
        nonlocal d_memory
        d_a, d_memory, g_cross = MH.attend_backward(d_out, w, cfg, cache, key(name, "cross"))
        g.update({f"cross.{n}": v for n, v in g_cross.items()})
        return d_a

    def ffn_backward(dy):
        d_f, g_ffn = tr.feed_forward_backward(dy, p, cfg, cache, key(name, "ffn"))
        g.update(g_ffn)
        return d_f

    def norm_backward(part):
        return lambda dy: N.backward(cfg, dy, p, part, cache, key(name, part), g)

    # 3. feed-forward
    if cfg.d_ff:
        dx = N.residual_backward(dx, ffn_backward, norm_backward("ln2"), cfg.norm_placement)
    # 2. cross-attention
    dx = N.residual_backward(dx, cross_attention_backward, norm_backward("ln_cross"), cfg.norm_placement)
    # 1. masked self-attention: the transformer's own block backward, on a block with only its attention
    dx, g_self = tb.block_backward(dx, p, dataclasses.replace(cfg, d_ff=0), cache, name)
    g.update(g_self)
    return dx, d_memory, g


def backward(params: dict, cfg: EncoderDecoderConfig, cache: dict, d_logits: np.ndarray) -> dict:
    """The gradient of every parameter from ``d_logits`` and :func:`forward`'s cache."""
    C.check_params(params, param_shapes(cfg), finite=True)
    grads: dict[str, np.ndarray] = {}
    # 3. the output, from the decoder's last block
    dx = tb.head_backward(d_logits, params, cfg.decoder, cache, grads, h_last=cache["dec.final"])
    # 2. the decoder blocks, last first; each adds its share to the memory's gradient
    memory = cache["memory"]
    d_memory = np.zeros_like(memory)
    for i in reversed(range(cfg.decoder.n_layers)):
        prefix = names.block(i, "dec.") + "."
        dx, dm, g = decoder_block_backward(dx, tr.block_params(params, prefix, widen=True), cfg.decoder, cache,
                                           names.block(i, "dec."))
        d_memory += dm
        grads.update({prefix + n: v for n, v in g.items()})
    _embed_backward(dx, params, cfg.decoder, cache["tokens"], "dec.", grads)
    # 1. the encoder blocks, last first, from the memory's gradient
    dh = d_memory
    for i in reversed(range(cfg.encoder.n_layers)):
        prefix = names.block(i, "enc.") + "."
        dh, g = tb.block_backward(dh, tr.block_params(params, prefix, widen=True), cfg.encoder, cache, names.block(i, "enc."))
        grads.update({prefix + n: v for n, v in g.items()})
    _embed_backward(dh, params, cfg.encoder, cache["enc.tokens"], "enc.", grads)
    return {name: grads[name] for name in param_shapes(cfg)}


def _embed_backward(dx, params: dict, cfg: TransformerConfig, tokens, prefix: str, grads: dict) -> None:
    """:func:`transformer_backward.embed_backward` for one prefixed stack."""
    mine = {n.removeprefix(prefix): v for n, v in params.items() if n in (f"{prefix}embed", f"{prefix}pos")}
    g = {"embed": grads.pop(f"{prefix}embed")} if f"{prefix}embed" in grads else {}
    tb.embed_backward(dx, mine, cfg, tokens, g)
    grads.update({prefix + n: v for n, v in g.items()})


def loss_and_grads(params: dict, cfg: EncoderDecoderConfig, src, tgt_in, tgt_out):
    """Mean cross-entropy over every target token, and its gradient for every parameter."""
    logits, cache = forward(params, cfg, src, tgt_in)
    y = tb.check_targets(tgt_out, cfg.decoder, cache["tokens"])
    loss, d_logits = L.cross_entropy(logits, y)
    return float(loss), backward(params, cfg, cache, d_logits)
