"""Two tracks for a training step, as for attention: the readable step the pages show, and its
compiled twin that trains fast. One place chooses between them, and says what ran.

    update = encoder_update("readable", state)                 # (tokens, labels), lr -> (loss, correct)
    gradient = decoder_gradient("compiled", cfg, flat)          # (tgt_in, tgt_out, src, out) -> loss
    for fn in step_functions("encoder", "readable"): ...        # the source a page shows

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

from core.model import decoder, optim
from core.model import params as P

from core.model.tuned import decoder_loss

from core.model import layers as L
from core.model import multi_head as MH
from core.model import transformer as tr
from core.model import transformer_backward as TB
from core.model import transformer_encdec as ED
from core.model.tuned import classifier
from core.model.tuned import decoder_gradient as compiled_decoder
from core.model.tuned import elementwise, embedding_and_loss, encoder_step, sublayers

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


# ----------------------------------------------------------------------------------------------
# what a page shows
# ----------------------------------------------------------------------------------------------
def step_functions(model: str, track: str, cross_attention: bool = False) -> list[Callable]:
    """The functions one training step of ``model`` (``"encoder"`` or ``"decoder"``; an
    encoder-decoder with ``cross_attention``) runs on ``track``, in the order they first run: what
    the training pages' source expanders show."""
    if check_track(track) == "readable":
        if model == "encoder":
            first = [encoder_update, TB.forward_backward]
        elif cross_attention:
            first = [decoder_gradient, decoder.loss_and_grads, ED.loss_and_grads, ED.forward,
                     ED.forward_checked, ED.decoder_block]
        else:
            first = [decoder_gradient, decoder.loss_and_grads, TB.loss_and_grads, TB.forward_backward]
        middle = [tr.forward, tr.forward_checked, tr.embed, tr.block, MH.attend, MH.softmax_rows,
                  tr.feed_forward, L.dense, tr.unembed, L.cross_entropy]
        last = [ED.backward, ED.decoder_block_backward] if cross_attention else \
            [TB.backward, TB.head_backward]
        return first + middle + last + [TB.block_backward, MH.attend_backward, tr.feed_forward_backward,
                                        tr.layer_norm_backward, TB.embed_backward, optim.Adam.step,
                                        elementwise.adam_update]
    if model == "encoder":
        return [encoder_update, classifier.train_step, encoder_step.run, encoder_step.forward_chunk, embedding_and_loss.embed_forward,
                encoder_step.encoder_layers, sublayers.self_attention, sublayers.feed_forward, embedding_and_loss.mean_pool,
                embedding_and_loss.classify, embedding_and_loss.cross_entropy, encoder_step.backward_chunk, embedding_and_loss.classify_backward,
                encoder_step.encoder_layers_backward, sublayers.feed_forward_backward,
                sublayers.self_attention_backward, embedding_and_loss.embed_backward, elementwise.adam_update]
    cross = [compiled_decoder.cross_attention, compiled_decoder.cross_attention_backward] if cross_attention else []
    return [decoder_gradient, decoder_loss.Gradient.__call__, compiled_decoder.decoder_gradient,
            compiled_decoder.decoder_chunk, sublayers.self_attention, *cross[:1], sublayers.feed_forward,
            compiled_decoder.token_cross_entropy, sublayers.feed_forward_backward, *cross[1:],
            sublayers.self_attention_backward, optim.Adam.step, elementwise.adam_update]
