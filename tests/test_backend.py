"""Backend selection: explicit name, ATTN_BACKEND, auto-detection, and clear errors."""
import threading

import numba
import numpy as np
import pytest

from core import attention as at
from core import backend
from core.kernels import dispatch
from core.kernels import reference as ref
from core.kernels.tuned import cpu


@pytest.fixture
def env(monkeypatch):
    def set_env(value):
        if value is None:
            monkeypatch.delenv("ATTN_BACKEND", raising=False)
        else:
            monkeypatch.setenv("ATTN_BACKEND", value)
        backend.refresh()
    yield set_env
    monkeypatch.delenv("ATTN_BACKEND", raising=False)
    backend.refresh()


def test_explicit_name_wins_over_the_environment(env):
    env("cuda")
    assert backend.resolve("cpu") == "cpu"


def test_environment_variable_is_used(env):
    env("cpu")
    assert backend.resolve() == "cpu"


def test_auto_never_takes_the_simulator_for_a_gpu(env, monkeypatch):
    env("auto")
    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 1)
    backend.gpu_present.cache_clear()
    assert backend.gpu_present() is False
    assert backend.resolve() == "cpu"
    backend.gpu_present.cache_clear()


def test_asking_for_cuda_without_a_gpu_is_a_clear_error(env, monkeypatch):
    env(None)
    monkeypatch.setattr(backend, "cuda_usable", lambda: False)
    with pytest.raises(ValueError, match="no CUDA GPU is available"):
        backend.resolve("cuda")
    assert backend.describe("cuda").startswith("unavailable")


def test_unknown_backend_name(env):
    with pytest.raises(ValueError, match="Unknown backend 'tpu'"):
        backend.resolve("tpu")


def test_describe_tells_a_person_what_runs():
    assert backend.describe("cpu") == f"CPU (Numba JIT, {numba.get_num_threads()} threads)"
    if backend.simulator_enabled():
        assert "simulator" in backend.describe("cuda")


def test_threading_layer_is_thread_safe():
    """Streamlit runs sessions in threads: the 'workqueue' layer would abort the process."""
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((2, 4, 64, 16))
    at.attention(Q, Q, Q, return_weights=False, backend="cpu")   # make sure a parallel region ran
    assert numba.threading_layer() in ("omp", "tbb")


def test_parallel_kernels_from_many_threads_at_once():
    """Eight threads call the parallel kernels together: every result is right, nothing crashes."""
    rng = np.random.default_rng(1)
    inputs = [tuple(rng.standard_normal((2, 4, 48, 16)) for _ in range(3)) for _ in range(8)]
    work = 2 * 4 * 48 * 48 * (16 + 16)
    assert dispatch.kernels_for("cpu", work) is cpu and work >= cpu.PARALLEL_MIN_WORK   # tuned, parallel builds
    expected = [ref.attention(*qkv)[0] for qkv in inputs]
    results, errors = [None] * 8, []
    start = threading.Barrier(8)

    def work(k):
        try:
            start.wait()
            for _ in range(5):
                fused, _ = at.attention(*inputs[k], return_weights=False, backend="cpu")
                out, _ = at.attention(*inputs[k], backend="cpu")
                np.testing.assert_allclose(fused, expected[k], atol=1e-12)
                np.testing.assert_allclose(out, expected[k], atol=1e-12)
            results[k] = fused
        except Exception as err:  # collected and re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r is not None for r in results)
