"""The decoder's gradient in one compiled call, for training (``core.training.decoder_runs.train``).

    grad = Gradient(cfg, flat)              # flat: the parameters in param_shapes order
    loss = grad(tgt_in, tgt_out, src, out)  # the mean cross-entropy; its gradient into out

:func:`core.model.decoder.loss_and_grads` computes the same numbers sublayer by sublayer, in
NumPy and small kernels: the version to read. This one runs the encoder's compiled kernels
(``core.model.compiled.decoder_gradient``) over chunks of sequences, with no Python between the
steps; at the page's sizes that is where a step made of a few hundred calls spent its time. The
tests hold the two to the same loss and gradients.
"""
from __future__ import annotations

import numpy as np

from core.model.compiled import decoder_gradient as K
from core.model.compiled.sublayers import LAYER_PARAMS, Layout
from core.model import layers
from core.model import params as P
from core.model.decoder_config import init_params, param_shapes, tiny_config


def _read_only(offsets: np.ndarray) -> np.ndarray:
    """Offsets as the encoder's layout holds them (read-only): the sublayers both compiled steps
    share then compile once for both (Numba types a read-only array apart from a writable one)."""
    offsets.setflags(write=False)
    return offsets


class Gradient:
    """The compiled loss-and-gradient of one model (``cfg``) whose parameters live in ``flat``."""

    def __init__(self, cfg, flat: np.ndarray):
        self.cfg, self.flat = cfg, flat
        shapes = param_shapes(cfg)
        self.offsets = offsets = P.offsets(shapes)
        if P.count(shapes) != flat.size:
            raise ValueError(f"flat holds {flat.size} numbers, the model has {P.count(shapes)}.")
        cross_rows = [[offsets[f"dec.layers.{i}.{_cross_name(n)}"] for n in K.CROSS_PARAMS]
                      for i in range(cfg.n_layers)] if cfg.cross_attention else []
        self.layout = K.DecoderLayout(
            self._stack("enc.", cfg.src_vocab_size or 0, cfg.src_len or 0, cfg.cross_attention),
            self._stack("dec.", cfg.vocab_size, cfg.tgt_len, True),
            _read_only(np.array(cross_rows, np.int64).reshape(-1, len(K.CROSS_PARAMS))))

    def _stack(self, prefix: str, vocab: int, length: int, present: bool) -> Layout:
        cfg, at = self.cfg, self.offsets
        rows = [[at.get(f"{prefix}layers.{i}.{name}", 0) for name in LAYER_PARAMS]
                for i in range(cfg.n_layers if present else 0)]
        top = np.array([at.get(f"{prefix}embed", 0), at.get(f"{prefix}pos", -1), at["W_out"], at["b_out"]], np.int64)
        return Layout(vocab, length, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size, cfg.positional == "learned",
                      _read_only(top), _read_only(np.array(rows, np.int64).reshape(-1, len(LAYER_PARAMS))))

    def _positions(self, prefix: str, length: int, T: int) -> np.ndarray:
        """``(T, d)``: what the forward pass adds to the first T embeddings (``decoder._embed``)."""
        cfg = self.cfg
        if T == 0:                                     # a decoder-only model's (absent) source
            return np.zeros((0, cfg.d_model), self.flat.dtype)
        if cfg.positional == "learned":
            at = self.offsets[f"{prefix}pos"]
            return self.flat[at:at + length * cfg.d_model].reshape(length, cfg.d_model)[:T]
        if cfg.positional == "sinusoidal":
            # a writable copy: a read-only array is another type to Numba, another compile of the step
            return layers.sinusoid_table(length, cfg.d_model, self.flat.dtype.str)[:T].copy()
        return np.zeros((T, cfg.d_model), self.flat.dtype)

    def __call__(self, tgt_in: np.ndarray, tgt_out: np.ndarray, src, out: np.ndarray) -> float:
        """The mean cross-entropy of checked int64 ``(B, T)`` targets (``src`` (B, S), or None for a
        decoder-only model); writes its gradient, in the layout of ``flat``, into ``out``."""
        cfg = self.cfg
        B, T = tgt_in.shape
        src = np.zeros((B, 0), np.int64) if src is None else src
        S = src.shape[1]
        pe_src = self._positions("enc.", cfg.src_len or 0, S)
        pe_tgt = self._positions("dec.", cfg.tgt_len, T)
        return float(K.decoder_gradient(self.flat, self.layout, np.ascontiguousarray(src, np.int64),
                                        np.ascontiguousarray(tgt_in, np.int64),
                                        np.ascontiguousarray(tgt_out, np.int64), pe_src, pe_tgt,
                                        float(cfg.ln_eps), out))


def _cross_name(name: str) -> str:
    """The decoder's name of a cross-attention array (``ln_g`` is ``ln_cross_g``)."""
    return {"ln_g": "ln_cross_g", "ln_b": "ln_cross_b"}.get(name, f"cross_{name}")


def warm_up(dtype=np.float32) -> None:
    """Compile (or load from Numba's on-disk cache) the gradient for ``dtype``, on a tiny model: the
    machine code depends on the dtype only, not on the sizes or the kind of model."""
    cfg = tiny_config()
    flat, _ = P.pack(init_params(cfg, 0, dtype))
    tokens, src = np.zeros((1, cfg.tgt_len), np.int64), np.zeros((1, cfg.src_len), np.int64)
    Gradient(cfg, flat)(tokens, tokens, src, np.empty_like(flat))
