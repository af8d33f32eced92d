"""Two tracks for a training step, as for attention: the readable step the pages show, and its
compiled twin that trains fast. One place chooses between them, and says what ran.

    update = encoder_update("readable", state)                 # (tokens, labels), lr -> (loss, correct)
    gradient = decoder_gradient("compiled", cfg, flat)          # (tgt_in, tgt_out, src, out) -> loss

``"readable"``: the one transformer's forward pass (:mod:`core.model.transformer`) and its backward
pass written by hand (:mod:`core.model.transformer_backward`), sublayer by sublayer in NumPy, then
Adam. ``"compiled"``: the same step as one call into Numba (:mod:`core.model.tuned`), with
no Python between the sublayers. The tests hold the two to the same loss and gradients (1e-12 in
float64, 2e-5 in float32); the compiled step is the faster one at every size the pages train.

Both tracks read and write the same flat buffers (parameters, gradient, Adam's moments), so a run
can switch tracks between two steps and go on from where it was.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from core.model import decoder
from core.model import params as P
from core.model import transformer_backward as TB
from core.model.tuned import classifier, decoder_loss

TRACKS = ("readable", "compiled")
DEFAULT_TRACK = "compiled"


def check_track(track: str) -> str:
    if track not in TRACKS:
        raise ValueError(f"A training step is 'readable' or 'compiled', got {track!r}.")
    return track


# ----------------------------------------------------------------------------------------------
# the encoder classifier
# ----------------------------------------------------------------------------------------------
def encoder_update(track: str, state) -> Callable:
    """An ``update(batch, lr) -> (loss, correct)`` for :func:`core.training.loop.steps` on a
    :class:`core.training.encoder_runs.TrainState`: one step of forward, backward and Adam."""
    if check_track(track) == "compiled":
        def update(batch, lr):
            state.optimizer.lr = lr
            return classifier.train_step(state.flat, state.grad_flat, state.optimizer, *batch, state.cfg)
        return update

    def update(batch, lr):
        tokens, labels = batch
        loss, logits, g = TB.forward_backward(state.params, state.cfg, tokens, labels)
        for name, value in g.items():
            state.grads[name][...] = value                                 # views of the gradient buffer
        state.optimizer.step(state.flat, state.grad_flat, lr)
        return loss, int((logits.argmax(axis=-1) == labels).sum())
    return update


# ----------------------------------------------------------------------------------------------
# the decoders (encoder-decoder, decoder-only, attention-only)
# ----------------------------------------------------------------------------------------------
def decoder_gradient(track: str, cfg, flat: np.ndarray) -> Callable:
    """``gradient(tgt_in, tgt_out, src, out) -> loss``: the mean cross-entropy over every target
    token of a batch, and its gradient into ``out`` (flat, in ``decoder.param_shapes(cfg)`` order).
    ``cfg``: a decoder-only TransformerConfig or an EncoderDecoderConfig."""
    if check_track(track) == "compiled":
        return decoder_loss.Gradient(cfg, flat)
    shapes = decoder.param_shapes(cfg)
    params = P.named_views(flat, shapes)

    def gradient(tgt_in, tgt_out, src, out):
        loss, grads = decoder.loss_and_grads(params, cfg, tgt_in, tgt_out, src)
        views = P.named_views(out, shapes)
        for name, value in grads.items():
            views[name][...] = value
        return loss
    return gradient
