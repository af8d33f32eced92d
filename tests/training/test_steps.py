"""The two tracks of a training step (core.training.steps): the readable step and the compiled one
take the same model to the same place, step for step, and either can take over a run."""
import numpy as np
import pytest

from core.training import steps, encoder_runs as training
from core.model.encoder import EncoderConfig

TOL = {np.float64: 1e-12, np.float32: 2e-5}
ENC = EncoderConfig(vocab_size=10, seq_len=8, d_model=16, n_heads=2, d_ff=24, n_layers=2)


def close(a, b, dtype, slack=1.0):
    tol = TOL[dtype] * slack
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


def encoder_batch(seed=0, B=12):
    rng = np.random.default_rng(seed)
    return rng.integers(0, ENC.vocab_size, (B, ENC.seq_len)), rng.integers(0, ENC.n_classes, B)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_encoder_steps_agree_step_for_step(dtype):
    """Three steps of forward, backward and Adam on each track: the same losses, correct counts,
    gradients and parameters. Adam divides each gradient by its running size, so where a gradient
    is tiny the tracks' last-digit differences grow by a few hundred in the parameters."""
    state = training.new_state(ENC, seed=3, lr=1e-2, dtype=dtype)
    twin = training.new_state(ENC, seed=3, lr=1e-2, dtype=dtype)
    readable, compiled = steps.encoder_update("readable", state), steps.encoder_update("compiled", twin)
    for k in range(3):
        batch = encoder_batch(k)
        (loss_r, hits_r), (loss_c, hits_c) = readable(batch, 1e-2), compiled(batch, 1e-2)
        assert hits_r == hits_c
        close(loss_r, loss_c, dtype)
        close(state.grad_flat, twin.grad_flat, dtype)
        close(state.flat, twin.flat, dtype, slack=1000)
    assert state.optimizer.t == twin.optimizer.t == 3


def test_a_run_switches_track_and_goes_on():
    """Both tracks read and write the same buffers: a run that changes track midway ends where a
    run on one track ends (float64, so the tracks' rounding differences stay at 1e-12)."""
    from core.training.tasks import make_dataset

    data = make_dataset("sum", 200, 50, 50, seed=0)
    cfg = training.config_for("sum", d_model=16, d_ff=16)
    one = training.new_state(cfg, data, seed=0, dtype=np.float64)
    list(training.train(one, data, max_steps=6, track="compiled"))
    mixed = training.new_state(cfg, data, seed=0, dtype=np.float64)
    list(training.train(mixed, data, max_steps=3, track="compiled"))
    list(training.train(mixed, data, max_steps=6, track="readable"))
    assert mixed.step == one.step == 6
    close(mixed.flat, one.flat, np.float64, slack=1000)


def test_an_unknown_track_is_refused():
    state = training.new_state(ENC, seed=0)
    with pytest.raises(ValueError, match="readable' or 'compiled"):
        steps.encoder_update("fast", state)
