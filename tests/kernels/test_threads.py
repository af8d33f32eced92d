"""Streamlit runs each session in its own thread, so the ``parallel=True`` kernels are entered from
several threads at once; results must still equal the NumPy reference (a non-thread-safe threading
layer would abort the process instead)."""
import threading

import numpy as np


def test_parallel_kernels_from_threads():
    from core import attention
    from core.kernels.tuned import cpu
    from core.kernels import reference

    B, H, T, d = 2, 4, 64, 16
    work = B * H * T * T * (2 * d + 8)
    assert work >= cpu.PARALLEL_MIN_WORK, "the shape must take the parallel (prange) build"
    n_threads, rounds = 8, 6
    rng = np.random.default_rng(7)
    inputs = [tuple(rng.normal(size=(B, H, T, d)) for _ in range(3)) for _ in range(n_threads)]
    mask = np.where(np.tril(np.ones((T, T), dtype=bool)), 0.0, -np.inf)
    expected = [reference.attention(Q, K, V, mask)[0] for Q, K, V in inputs]
    attention.attention(*inputs[0], mask, return_weights=False, backend="cpu")   # compile outside the race

    barrier = threading.Barrier(n_threads)
    failures: list[str] = []

    def worker(t: int) -> None:
        Q, K, V = inputs[t]
        try:
            barrier.wait()
            for r in range(rounds):
                out, weights = attention.attention(Q, K, V, mask, return_weights=False, backend="cpu")
                assert weights is None
                np.testing.assert_allclose(out, expected[t], rtol=1e-10, atol=1e-12)
                out_w, A = attention.attention(Q, K, V, mask, backend="cpu")
                np.testing.assert_allclose(out_w, expected[t], rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-12)
        except BaseException as err:  # noqa: BLE001 - reported from the main thread
            failures.append(f"thread {t}: {err}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung in a parallel kernel"
    assert failures == []
    import numba
    assert numba.threading_layer() in ("omp", "tbb"), numba.threading_layer()
