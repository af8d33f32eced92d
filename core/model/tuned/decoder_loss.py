"""The decoder's gradient in one compiled call, for training (``core.training.decoder_runs.train``).

    grad = Gradient(cfg, flat)              # flat: the parameters in param_shapes order
    loss = grad(tgt_in, tgt_out, src, out)  # the mean cross-entropy; its gradient into out

:func:`core.model.decoder.loss_and_grads` computes the same numbers sublayer by sublayer, in
NumPy and small kernels: the version to read. This one runs the encoder's compiled kernels
(``core.model.tuned.decoder_gradient``) over chunks of sequences, with no Python between the
steps; at the page's sizes that is where a step made of a few hundred calls spent its time. The
tests hold the two to the same loss and gradients.
"""
from __future__ import annotations

import numpy as np

from core.model import presets
from core.model import params as P
from core.model.tuned import decoder_gradient, offsets
from core.model.decoder import init_params, param_shapes
from core.model.transformer_encdec import EncoderDecoderConfig


class Gradient:
    """The compiled loss-and-gradient of one model (``cfg``: a decoder-only
    :class:`~core.model.config.TransformerConfig` or an :class:`EncoderDecoderConfig`) whose
    parameters live in ``flat``, packed in ``param_shapes(cfg)`` order."""

    def __init__(self, cfg, flat: np.ndarray):
        n_params = P.count(param_shapes(cfg))
        if n_params != flat.size:
            raise ValueError(f"flat holds {flat.size} numbers, the model has {n_params}.")
        self.cfg, self.flat = cfg, flat
        self.layout = offsets.decoder_layout(cfg)
        self.stacks = (cfg.encoder, cfg.decoder) if isinstance(cfg, EncoderDecoderConfig) else (None, cfg)
        # a decoder-only model's absent source: no positions, read-only as every positional table is
        self.no_source = np.zeros((0, self.stacks[1].d_model), flat.dtype)
        self.no_source.setflags(write=False)

    def __call__(self, tgt_in: np.ndarray, tgt_out: np.ndarray, src, out: np.ndarray) -> float:
        """The mean cross-entropy of checked int64 ``(B, T)`` targets (``src`` (B, S), or None for a
        decoder-only model); writes its gradient, in the layout of ``flat``, into ``out``."""
        source, target = self.stacks
        B, T = tgt_in.shape
        if source is None:
            src, pe_src = np.zeros((B, 0), np.int64), self.no_source
        else:
            pe_src = offsets.positions(self.flat, source, self.layout.enc, src.shape[1])
        pe_tgt = offsets.positions(self.flat, target, self.layout.dec, T)
        return float(decoder_gradient.decoder_gradient(
            self.flat, self.layout, np.ascontiguousarray(src, np.int64), np.ascontiguousarray(tgt_in, np.int64),
            np.ascontiguousarray(tgt_out, np.int64), pe_src, pe_tgt, float(target.ln_eps), out))


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from Numba's on-disk cache) the gradient for ``dtype``, on a tiny
    encoder-decoder: the machine code depends on the dtype only, not on the sizes or the kind of model."""
    cfg = presets.seq2seq(vocab_size=5, n_ctx=3, src_vocab_size=5, src_len=3, d_model=4, n_heads=1, d_ff=4,
                          n_layers=1, bos_id=0)
    flat, _ = P.pack(init_params(cfg, 0, dtype))
    tokens = np.zeros((1, 3), np.int64)
    Gradient(cfg, flat)(tokens, tokens, tokens, np.empty_like(flat))
