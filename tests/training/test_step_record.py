"""One training step recorded (core/training/step_record.py): the source the training pages show.

- each track's step records its own code and not the other's: the readable one the transformer's
  forward and hand-written backward, the compiled one the Numba step (read into from its code);
- the record follows the model: a decoder-only model's readable step runs no encoder-decoder code,
  an encoder-decoder's does; the activation the config names is the one recorded;
- both end with Adam.
"""
from __future__ import annotations

import dataclasses

import pytest

from core.kernels import dispatch
from core.model import presets
from core.training import step_record


def names(ran) -> set[str]:
    return {f"{fn.__module__}.{fn.__qualname__}" for fn in dispatch.functions_behind(ran)}


ENCODER = presets.encoder_classifier(vocab_size=5, n_ctx=6, d_model=8, n_heads=2, d_ff=16, n_layers=1)
LM = presets.decoder_lm(vocab_size=7, n_ctx=5, d_model=8, n_heads=2, d_ff=16, n_layers=1)
SEQ2SEQ = presets.seq2seq(vocab_size=7, n_ctx=5, src_vocab_size=6, src_len=4, d_model=8, n_heads=2, d_ff=16,
                          n_layers=1)


def test_the_encoders_two_steps_each_record_their_own_code():
    readable, compiled = (names(step_record.encoder_step(ENCODER, track)) for track in ("readable", "compiled"))
    assert {"core.training.steps.encoder_update", "core.model.transformer_backward.forward_backward",
            "core.model.transformer_backward.backward", "core.model.transformer.forward",
            "core.model.optim.Adam.step", "core.model.tuned.elementwise.adam_update"} <= readable
    assert {"core.training.steps.encoder_update", "core.model.tuned.classifier.train_step",
            "core.model.tuned.encoder_step.run",
            "core.model.tuned.encoder_step.encoder_layers_backward"} <= compiled     # read from the Numba code
    assert not [n for n in readable if n.startswith("core.model.tuned.classifier")]
    assert not [n for n in compiled if n.startswith("core.model.transformer")]
    assert not [n for n in readable | compiled if n.startswith(("core.training.step_record", "core.recording"))]


@pytest.mark.parametrize("track", ["readable", "compiled"])
def test_a_decoder_step_runs_its_own_model(track):
    lm, pair = names(step_record.decoder_step(LM, track)), names(step_record.decoder_step(SEQ2SEQ, track))
    assert "core.model.optim.Adam.step" in lm and "core.model.optim.Adam.step" in pair
    if track == "readable":
        assert "core.model.transformer_backward.loss_and_grads" in lm
        assert not [n for n in lm if n.startswith("core.model.transformer_encdec.") and "target_stack" not in n]
        assert {"core.model.transformer_encdec.encode", "core.model.transformer_encdec.decoder_block_backward"} <= pair
    else:
        assert {"core.model.tuned.decoder_loss.Gradient.__call__",
                "core.model.tuned.decoder_gradient.decoder_chunk"} <= lm & pair
        assert not [n for n in lm | pair if n.startswith("core.model.transformer")]


def test_the_activation_recorded_is_the_configs():
    relu = names(step_record.encoder_step(ENCODER, "readable"))
    gelu = names(step_record.encoder_step(dataclasses.replace(ENCODER, activation="gelu_tanh"), "readable"))
    assert "core.model.activations.relu" in relu and "core.model.activations.gelu_tanh" not in relu
    assert "core.model.activations.gelu_tanh" in gelu and "core.model.activations.relu" not in gelu
