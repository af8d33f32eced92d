"""The two tracks of a training step (core.training.steps): the readable step and the compiled one
take the same model to the same place, step for step, and either can take over a run. For the
encoder classifier this is the one place that holds the readable track (the one transformer's
forward and backward) to the compiled one (core.model.tuned.classifier)."""
import numpy as np
import pytest

from core.model import transformer
from core.model.tuned import classifier
from core.training import steps, encoder_runs
from core.model.tuned.classifier import EncoderConfig

TOL = {np.float64: 1e-12, np.float32: 2e-5}
ENC = EncoderConfig(vocab_size=10, seq_len=8, d_model=16, n_heads=2, d_ff=24, n_layers=2)
ENCODERS = {          # each positional kind, at other sizes too: one block, three classes, three heads, d_ff < d_model
    "sinusoidal": ENC,
    "learned": EncoderConfig(vocab_size=9, seq_len=8, d_model=8, n_heads=2, d_ff=12, n_layers=1, n_classes=3,
                             positional="learned"),
    "none": EncoderConfig(vocab_size=9, seq_len=8, d_model=12, n_heads=3, d_ff=8, n_layers=2, positional="none"),
}


def close(a, b, dtype, slack=1.0):
    tol = TOL[dtype] * slack
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


def encoder_batch(seed=0, B=12, cfg=ENC):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, cfg.n_ctx)), rng.integers(0, cfg.n_classes, B)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_steps_agree_step_for_step(name, dtype):
    """Three steps of forward, backward and Adam on each track: the same losses, correct counts,
    gradients and parameters. Adam divides each gradient by its running size, so where a gradient
    is tiny the tracks' last-digit differences grow by a few hundred in the parameters."""
    cfg = ENCODERS[name]
    state = encoder_runs.new_state(cfg, seed=3, lr=1e-2, dtype=dtype)
    twin = encoder_runs.new_state(cfg, seed=3, lr=1e-2, dtype=dtype)
    readable, compiled = steps.encoder_update("readable", state), steps.encoder_update("compiled", twin)
    for k in range(3):
        batch = encoder_batch(k, cfg=cfg)
        (loss_r, hits_r), (loss_c, hits_c) = readable(batch, 1e-2), compiled(batch, 1e-2)
        assert hits_r == hits_c
        close(loss_r, loss_c, dtype)
        close(state.grad_flat, twin.grad_flat, dtype)
        close(state.flat, twin.flat, dtype, slack=1000)
    assert state.optimizer.t == twin.optimizer.t == 3


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_forwards_agree_under_the_same_names(name, dtype):
    """The compiled forward (core.model.tuned.classifier) and the readable one (core.model.transformer) on the
    same parameters: the same logits, and the compiled cache's arrays under the readable cache's names
    (every block's attention weights, the last block's output, the pooled states, the logits)."""
    cfg = ENCODERS[name]
    rng = np.random.default_rng(5)
    params = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype)        # biases and gains off their start
              for n, v in classifier.init_params(cfg, seed=5, dtype=np.float64).items()}
    tokens = encoder_batch(6, B=21, cfg=cfg)[0][:, :-1]                 # two chunks, one padded; T < n_ctx
    logits, cache = classifier.forward(params, tokens, cfg)
    want, readable = transformer.forward(params, cfg, tokens)
    assert logits.dtype == want.dtype == dtype
    close(logits, want, dtype)
    for key in [f"blocks.{i}.attn.weights" for i in range(cfg.n_layers)] + [
            f"blocks.{cfg.n_layers - 1}.resid_post", "pooled", "logits"]:
        close(cache[key], readable[key], dtype)
    np.testing.assert_array_equal(cache["attn"], np.stack([cache[f"blocks.{i}.attn.weights"]
                                                           for i in range(cfg.n_layers)]))


def test_a_run_switches_track_and_goes_on():
    """Both tracks read and write the same buffers: a run that changes track midway ends where a
    run on one track ends (float64, so the tracks' rounding differences stay at 1e-12)."""
    from core.training.tasks import make_dataset

    data = make_dataset("sum", 200, 50, 50, seed=0)
    cfg = encoder_runs.config_for("sum", d_model=16, d_ff=16)
    one = encoder_runs.new_state(cfg, data, seed=0, dtype=np.float64)
    list(encoder_runs.train(one, data, max_steps=6, track="compiled"))
    mixed = encoder_runs.new_state(cfg, data, seed=0, dtype=np.float64)
    list(encoder_runs.train(mixed, data, max_steps=3, track="compiled"))
    list(encoder_runs.train(mixed, data, max_steps=6, track="readable"))
    assert mixed.step == one.step == 6
    close(mixed.flat, one.flat, np.float64, slack=1000)


def test_an_unknown_track_is_refused():
    state = encoder_runs.new_state(ENC, seed=0)
    with pytest.raises(ValueError, match="readable' or 'compiled"):
        steps.encoder_update("fast", state)
