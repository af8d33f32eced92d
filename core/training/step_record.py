"""What one training step runs, recorded: the source a training page shows for a track's step.

One step, run on purpose on a fresh model of the page's configuration and a batch of two sequences,
inside :func:`core.recording.recording`: the record holds every function of core that the step ran
(its compiled functions with the compiled functions they call, read from their code by
``core.kernels.dispatch.functions_behind``), so a page lists no function by hand. The step is the
training loop's ``update(batch, lr)``, as the runs call it: the forward pass, the loss, the backward
pass and Adam.

    ran = encoder_step(cfg, "readable")      # the encoder classifier's update (steps.encoder_update)
    ran = decoder_step(cfg, "compiled")      # every decoder's: steps.decoder_gradient, then Adam

The compiled track needs its compiled step loaded (``core.warmup.ready``): on a server still compiling
it, ask only for the readable one.
"""
from __future__ import annotations

import numpy as np

from core.model import decoder, optim
from core.model import params as P
from core.model.transformer_encdec import EncoderDecoderConfig, target_stack
from core.recording import Record, recorded, recording
from core.training import encoder_runs, loop, steps

LR = 1e-3            # any rate: a step runs the same code at every one
BATCH = 2


def encoder_step(cfg, track: str) -> Record:
    """The record of one update of the encoder classifier ``cfg`` on ``track``."""
    state = encoder_runs.new_state(cfg, seed=0, batch_size=BATCH)
    update = steps.encoder_update(steps.check_track(track), state)
    batch = np.zeros((BATCH, cfg.n_ctx), np.int64), np.zeros(BATCH, np.int64)
    with recording() as ran:
        recorded(update)(batch, LR)
    return ran


def decoder_step(cfg, track: str) -> Record:
    """The record of one update of a decoder on ``track``, as :func:`core.training.decoder_runs.train_on`
    (the training of every decoder) builds it; ``cfg`` a decoder-only TransformerConfig or an
    EncoderDecoderConfig."""
    params = decoder.init_params(cfg, seed=0, dtype=np.float32)
    flat, _ = P.pack({name: params[name] for name in decoder.param_shapes(cfg)})   # train_on's order
    gradient = steps.decoder_gradient(steps.check_track(track), cfg, flat)
    update = loop.gradient_update(gradient, flat, np.empty_like(flat),
                                  optim.Adam(flat.size, flat.dtype, LR, betas=decoder.ADAM_BETAS))
    tgt = np.zeros((BATCH, target_stack(cfg).n_ctx), np.int64)
    src = np.zeros((BATCH, cfg.encoder.n_ctx), np.int64) if isinstance(cfg, EncoderDecoderConfig) else None
    with recording() as ran:
        recorded(update)((tgt, tgt, src), LR)
    return ran
