"""core/kernels/tuned/simd.py: the vector operations, and the attention kernels at another vector width."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from core.kernels.tuned import simd, target, tiles

ROOT = Path(__file__).resolve().parents[2]


@njit
def _axpy_by_vectors(a, x, y, out):
    """``out = a * x + y`` one vector at a time (lengths a multiple of the lane count)."""
    for i in range(0, x.shape[0], simd.lanes_of(x)):
        simd.store(out, i, simd.fma(simd.splat(a, x), simd.load(x, i), simd.load(y, i)))


@njit
def _sum_by_vectors(x, out):
    """``out[:lanes] = sum over vectors of x`` plus zeros."""
    total = simd.zeros(x)
    for i in range(0, x.shape[0], simd.lanes_of(x)):
        total = simd.add(total, simd.load(x, i))
    simd.store(out, 0, total)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_operations_match_numpy(dtype):
    L = simd.lanes(np.dtype(dtype))
    assert L * np.dtype(dtype).itemsize == simd.VECTOR_BYTES in (16, 32, 64)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(3 * L).astype(dtype), rng.standard_normal(3 * L).astype(dtype)
    out = np.full(3 * L, np.nan, dtype)
    _axpy_by_vectors(dtype(1.5), x, y, out)
    np.testing.assert_allclose(out, 1.5 * x + y, rtol=1e-6)
    total = np.full(L, np.nan, dtype)
    _sum_by_vectors(x, total)
    np.testing.assert_allclose(total, x.reshape(3, L).sum(0), rtol=1e-6)


@njit
def _codes_by_vectors(raw, out):
    """Each vector's bytes read three ways: ``out[0]`` low nibbles, ``out[1]`` high ones, ``out[2]``
    signed bytes (``raw`` starts one byte in: the loads need no alignment)."""
    for i in range(0, out.shape[1], simd.lanes_of(out)):
        simd.store(out[0], i, simd.low_nibbles(raw, i + 1, out))
        simd.store(out[1], i, simd.high_nibbles(raw, i + 1, out))
        simd.store(out[2], i, simd.signed_bytes(raw, i + 1, out))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bytes_read_as_codes_match_numpy(dtype):
    L = simd.lanes(np.dtype(dtype))
    raw = np.arange(3 * L + 1, dtype=np.int64) * 37 % 256
    raw[1:3] = (0x0F, 0xF0)                      # each nibble at its ends
    raw = raw.astype(np.uint8)
    out = np.full((3, 3 * L), np.nan, dtype)
    _codes_by_vectors(raw, out)
    codes = raw[1:]
    assert np.array_equal(out[0], codes & 0x0F) and np.array_equal(out[1], codes >> 4)
    assert np.array_equal(out[2], codes.view(np.int8))


@njit
def _elementwise_by_vectors(x, y, lo, hi, out):
    """Per vector: ``floor(x) * y - y``, ``2**floor(x)``, and ``x`` where ``lo <= i < hi`` and
    ``x >= y``, else 0; returns the sum of every lane of the last."""
    L = simd.lanes_of(x)
    first, end, picked_sum = simd.splat(lo, x), simd.splat(hi, x), simd.zeros(x)
    for i in range(0, x.shape[0], L):
        u, v = simd.load(x, i), simd.load(y, i)
        simd.store(out[0], i, simd.floor(u) * v - v)
        simd.store(out[1], i, simd.pow2(simd.floor(u)))
        index = simd.lane_numbers(x) + simd.splat(i, x)
        picked = simd.where((index >= first) & (index < end) & (u >= v), u, simd.zeros(x))
        simd.store(out[2], i, picked)
        picked_sum = picked_sum + picked
    return simd.total(picked_sum)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arithmetic_masks_and_lane_sums_match_numpy(dtype):
    L = simd.lanes(np.dtype(dtype))
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal(4 * L) * 20).astype(dtype), rng.standard_normal(4 * L).astype(dtype)
    y[5] = np.nan                              # a NaN compares false: that lane is not picked
    out = np.full((3, 4 * L), np.nan, dtype)
    lo, hi = 3, 3 * L + 1
    got_sum = _elementwise_by_vectors(x, y, lo, hi, out)
    np.testing.assert_allclose(out[0], np.floor(x) * y - y, rtol=1e-6)
    assert (out[1] == 2.0 ** np.floor(x)).all()
    i = np.arange(4 * L)
    with np.errstate(invalid="ignore"):
        want = np.where((i >= lo) & (i < hi) & (x >= y), x, 0)
    assert (out[2] == want).all() and out[2][5] == 0
    np.testing.assert_allclose(got_sum, want.sum(), rtol=1e-5)


_NARROW = textwrap.dedent("""
    import numpy as np
    from core import masks
    from core.kernels.tuned import cpu
    from core.kernels.tuned import simd
    from core.kernels import reference as ref
    assert simd.VECTOR_BYTES == 16, simd.VECTOR_BYTES
    rng = np.random.default_rng(0)
    cpu.KEY_TILE = 7
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        for Tq, Tk, dk, dv, causal in ((6, 37, 3, 5, False), (9, 9, 4, 6, True)):
            Q = rng.standard_normal((1, 2, Tq, dk)).astype(dtype)
            K = rng.standard_normal((1, 2, Tk, dk)).astype(dtype)
            V = rng.standard_normal((1, 2, Tk, dv)).astype(dtype)
            mask = masks.causal(max(Tq, Tk), dtype)[:Tq, :Tk] if causal else np.zeros((1, 1), dtype)
            want_out, want_A = ref.attention(Q.astype(np.float64), K, V, mask)
            out, A = cpu.attention_with_weights(Q, K, V, mask.reshape((1, 1) + mask.shape), 1 / np.sqrt(dk))
            fused = cpu.fused_attention(Q, K, V, mask.reshape((1, 1) + mask.shape), 1 / np.sqrt(dk))
            for got, want in ((A, want_A), (out, want_out), (fused, want_out)):
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    print("ok")
""")


@pytest.mark.compile
def test_attention_kernels_are_right_with_narrow_vectors(tmp_path):
    """Compiled for a generic CPU (16-byte vectors, as SSE or ARM NEON: 4 float32 lanes, 2 float64),
    so the tiles run many vectors per row and the padding differs from this machine's."""
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", _NARROW], capture_output=True, text=True, env=env,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


# --- the vector width follows the compile target, not the host --------------------------------
AVX2_HOST = ("znver3", "+avx,+avx2,+fma,-avx512f,-avx512bw")
AVX512_HOST = ("skylake-avx512", "+avx,+avx2,+fma,+avx512f,+avx512bw")
SSE_HOST = ("x86-64", "+sse2,-avx,-avx2,-avx512f")


@pytest.mark.parametrize("cpu_name, cpu_features, host, expected", [
    (None, None, AVX2_HOST, 32),                       # nothing set: the host's
    (None, None, AVX512_HOST, 64),
    (None, None, SSE_HOST, 16),
    ("host", None, AVX512_HOST, 64),
    ("haswell", "", AVX512_HOST, 32),                  # AVX2 forced on an AVX-512 host
    ("haswell", "-avx512f", AVX512_HOST, 32),
    ("haswell", None, AVX512_HOST, 64),                # Numba then passes the host's features: AVX-512 code
    ("skylake-avx512", "", AVX2_HOST, 64),             # AVX-512 compiled on an AVX2 host
    ("skylake-avx512", "-avx512f", AVX2_HOST, 32),
    ("generic", "", AVX512_HOST, 16),                  # portable caches
    ("generic", "+avx2", SSE_HOST, 32),
    ("znver3", "", SSE_HOST, 32),
])
def test_vector_width_follows_the_compile_target(cpu_name, cpu_features, host, expected):
    assert target.vector_bytes(cpu_name, cpu_features, *host) == expected


def test_register_tile_fits_the_target_register_file():
    assert target.registers(32) == 16 and target.registers(16) == 16 and target.registers(64) == 32
    assert target.TILE_ROWS * target.TILE_VECTORS + target.TILE_VECTORS + 1 <= target.REGISTERS
    assert simd.VECTOR_BYTES == target.VECTOR_BYTES
    # As wide as the register file allows: 4 x 4 with AVX-512's 32 registers, 4 x 2 with 16.
    assert target.TILE_VECTORS == (4 if target.REGISTERS == 32 else 2)
    # ... and a build for 16 registers compiles no 4 x 4 tile at all (see tiles.WIDE_TILES).
    assert tiles.WIDE_TILES == (target.REGISTERS == 32)
    assert f"register tile 4 queries x {target.TILE_VECTORS} vectors" in target.describe()


_AVX512_COMPILE = textwrap.dedent("""
    import numpy as np
    from numba import njit
    from core.kernels.tuned import simd, target
    from core.kernels.tuned import cpu

    @njit
    def axpy(a, x, y, out):
        for i in range(0, x.shape[0], simd.lanes_of(x)):
            simd.store(out, i, simd.fma(simd.splat(a, x), simd.load(x, i), simd.load(y, i)))

    axpy.compile("(float32, float32[::1], float32[::1], float32[::1])")
    asm = next(iter(axpy.inspect_asm().values()))
    assert "zmm" in asm, "no 64-byte registers in the compiled code"
    print(simd.VECTOR_BYTES, simd.lanes(np.dtype(np.float32)), target.REGISTERS, target.TILE_VECTORS, cpu.KEY_TILE)
""")


@pytest.mark.compile
def test_an_avx512_target_compiles_with_16_lane_vectors_on_any_host(tmp_path):
    """Compiled for skylake-avx512 (not run: this host may lack AVX-512): 64-byte vectors, 16 float32
    lanes, 32 registers, a register tile four vectors wide, and LLVM emits zmm registers for them."""
    env = dict(os.environ, NUMBA_CPU_NAME="skylake-avx512", NUMBA_CPU_FEATURES="", NUMBA_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", _AVX512_COMPILE], capture_output=True, text=True, env=env,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["64", "16", "32", "4", str(target.KEY_BLOCK)]
