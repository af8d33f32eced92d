"""Lesson kernels (``core.kernels.cpu`` and ``core.kernels.gpu``) against the NumPy reference.

Every driver runs on both tracks with the same cases. Without a GPU the CUDA kernels run on
Numba's CUDA simulator (conftest.py), one Python thread per GPU thread: the shapes are tiny, and
blocks of 4 threads and key tiles of 3 make them span several blocks, partial tiles and idle
threads all the same.
"""
from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.kernels import reference as ref
from core.kernels import cpu as lesson_cpu
from core.kernels import gpu as lesson_gpu

from kernel_tables import CASES, DRIVERS, SHAPES, make_case

TOL = {np.float32: 1e-5, np.float64: 1e-12}
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(params=["cpu", "gpu"])
def kernels(request, monkeypatch):
    """The lesson kernel module; the GPU's with blocks of 4 threads and key tiles of 3."""
    if request.param == "cpu":
        return lesson_cpu
    monkeypatch.setattr(lesson_gpu, "THREADS", 4)
    monkeypatch.setattr(lesson_gpu, "TILE", 3)
    return lesson_gpu


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


def assert_close(actual, desired, dtype):
    assert actual.dtype == dtype
    assert actual.shape == desired.shape
    np.testing.assert_allclose(actual, desired, rtol=TOL[dtype], atol=TOL[dtype])


def dead_rows_of(mask, shape):
    """Which rows ``(b, h, i)`` of weights of this shape have no key allowed."""
    return np.broadcast_to(mask == -np.inf, shape).all(axis=-1)


def assert_weight_invariants(A, mask):
    """No NaN; rows sum to 1 (0 where nothing is allowed); masked weights exactly 0."""
    masked = np.broadcast_to(mask == -np.inf, A.shape)
    assert not np.isnan(A).any()
    assert (A[masked] == 0).all()
    dead = dead_rows_of(mask, A.shape)
    np.testing.assert_allclose(A.sum(axis=-1), np.where(dead, 0.0, 1.0), atol=1e-6)
    assert (A[dead] == 0).all()


# --- attention ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_scaled_scores(kernels, shape_name, mask_name, dtype):
    Q, K, _, mask, scale = make_case(shape_name, mask_name, dtype)
    assert_close(kernels.scaled_scores(Q, K, mask, scale), ref.scaled_scores(Q, K, mask, scale), dtype)


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_attention_with_weights(kernels, shape_name, mask_name, dtype):
    Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
    out, A = kernels.attention_with_weights(Q, K, V, mask, scale)
    out_ref, A_ref = ref.attention(Q, K, V, mask, scale)
    assert_close(A, A_ref, dtype)
    assert_close(out, out_ref, dtype)
    assert_weight_invariants(A, mask)
    assert (out[dead_rows_of(mask, A.shape)] == 0).all()      # looking nowhere gives a zero output


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_attention_with_scores(kernels, shape_name, mask_name, dtype):
    """The weights and output of attention_with_weights, to the bit, and the masked scores they are
    the softmax of, as the reference computes them."""
    Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
    out, A, S = kernels.attention_with_scores(Q, K, V, mask, scale)
    assert_close(S, ref.scaled_scores(Q, K, mask, scale), dtype)
    out_w, A_w = kernels.attention_with_weights(Q, K, V, mask, scale)
    np.testing.assert_array_equal(A, A_w)
    np.testing.assert_array_equal(out, out_w)
    np.testing.assert_array_equal(S, kernels.scaled_scores(Q, K, mask, scale))      # the same kernels
    assert_close(A, ref.softmax(S.astype(np.float64)).astype(dtype), dtype)       # A is the softmax of S


@pytest.mark.parametrize("shape_name, mask_name", CASES)
def test_fused_attention(kernels, shape_name, mask_name, dtype):
    Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
    out = kernels.fused_attention(Q, K, V, mask, scale)
    assert_close(out, ref.attention(Q, K, V, mask, scale)[0], dtype)
    dead = dead_rows_of(mask, Q.shape[:3] + (K.shape[2],))
    assert (out[dead] == 0).all()


@pytest.mark.parametrize("shape_name", ["one", "cross", "batched"])
def test_weighted_sum(kernels, shape_name, dtype):
    """Any weights, not only softmax rows: the kernel is the product ``A V``."""
    Q, _, V, _, _ = make_case(shape_name, "none", dtype)
    rng = np.random.default_rng(1)
    A = rng.standard_normal(Q.shape[:3] + (V.shape[2],)).astype(dtype)
    assert_close(kernels.weighted_sum(A, V), A @ V, dtype)


def test_the_cases_hold_dead_rows_and_rows_with_several_keys():
    """Guard against vacuous invariants: some masks do mask whole rows, and padding leaves several
    keys allowed in every row while masking others."""
    def rows(shape_name, mask_name):
        B, H, Tq, Tk, _, _ = SHAPES[shape_name]
        allowed = np.broadcast_to(make_case(shape_name, mask_name, np.float64)[3] == 0, (B, H, Tq, Tk))
        return allowed.sum(axis=-1), Tk

    for shape_name, mask_name in (("square", "dead_row"), ("cross", "random"), ("batched", "random")):
        assert (rows(shape_name, mask_name)[0] == 0).any()
    for shape_name in ("cross", "batched"):
        n_allowed, Tk = rows(shape_name, "padding")
        assert n_allowed.min() >= 2 and n_allowed.min() < Tk


def test_huge_finite_scores_stay_finite(kernels, dtype):
    """Scores of +-1e30 give finite weights summing to 1 (each row's max is subtracted first)."""
    rng = np.random.default_rng(1)
    Q, K, V = (rng.standard_normal((1, 1, n, 2)).astype(dtype) for n in (3, 5, 5))
    mask = np.zeros((1, 1, 3, 5), dtype)
    mask[0, 0, 0, 1] = 1e30                                 # one key takes all the weight
    mask[0, 0, 1, :] = [1e30, 1e30, -1e30, -np.inf, 0.0]    # a tie at the top
    mask[0, 0, 2, 4] = -1e30
    out, A = kernels.attention_with_weights(Q, K, V, mask, 1.0)
    np.testing.assert_array_equal(A[0, 0, 0], [0, 1, 0, 0, 0])
    np.testing.assert_allclose(A[0, 0, 1], [0.5, 0.5, 0, 0, 0], rtol=TOL[dtype])
    assert_close(out, ref.attention(Q, K, V, mask, 1.0)[0], dtype)
    fused = kernels.fused_attention(Q, K, V, mask, 1.0)
    assert_close(fused, ref.attention(Q, K, V, mask, 1.0)[0], dtype)
    np.testing.assert_allclose(fused[0, 0, 0], V[0, 0, 1], rtol=TOL[dtype])


@pytest.mark.parametrize("tile, threads", [(1, 1), (2, 3), (16, 2)])
def test_gpu_fused_attention_any_tile_and_block(monkeypatch, tile, threads):
    """Each tile and block size builds its own kernel, and all give the reference's answer."""
    monkeypatch.setattr(lesson_gpu, "TILE", tile)
    monkeypatch.setattr(lesson_gpu, "THREADS", threads)
    Q, K, V, mask, scale = make_case("cross", "random", np.float64)
    assert_close(lesson_gpu.fused_attention(Q, K, V, mask, scale), ref.attention(Q, K, V, mask, scale)[0],
                 np.float64)


def test_gpu_fused_attention_shortens_tiles_of_wide_heads(monkeypatch):
    """Key tiles that would not fit in shared memory shrink (here to one key) and stay correct."""
    monkeypatch.setattr(lesson_gpu, "SHARED_BYTES", 1)
    monkeypatch.setattr(lesson_gpu, "THREADS", 4)
    Q, K, V, mask, scale = make_case("square", "causal", np.float32)
    assert_close(lesson_gpu.fused_attention(Q, K, V, mask, scale), ref.attention(Q, K, V, mask, scale)[0],
                 np.float32)


def test_cpu_kernels_build_once_per_dtype():
    """Masks of every broadcast shape reuse one build of each kernel per dtype: a second build
    (say, for another array layout) would cost a compile in the middle of a lesson. Counted in a
    fresh process, so that only these calls count, not those of the tests that ran before."""
    script = """
import numpy as np
from core.kernels import cpu as lesson_cpu
from kernel_tables import CASES, cpu_kernels, make_case
for shape_name, mask_name in CASES:
    for dtype in (np.float32, np.float64):
        Q, K, V, mask, scale = make_case(shape_name, mask_name, dtype)
        lesson_cpu.attention_with_weights(Q, K, V, mask, scale)
        lesson_cpu.fused_attention(Q, K, V, mask, scale)
for kernel in cpu_kernels(lesson_cpu):
    print(kernel.__name__, len(kernel.signatures))
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")])), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    builds = dict(line.split() for line in out.stdout.split("\n") if line)
    assert builds and all(int(n) <= 2 for n in builds.values()), builds


# --- projections and positions ----------------------------------------------------------------

# (B, T, d_in, H, d): sizes that are not multiples of the patched block of 4 threads
PROJECTIONS = [(1, 1, 3, 1, 2), (2, 5, 6, 3, 3), (1, 7, 9, 2, 5)]


@pytest.mark.parametrize("B, T, d_in, H, d", PROJECTIONS)
def test_project_heads(kernels, B, T, d_in, H, d, dtype):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((B, T, d_in)).astype(dtype)
    W = rng.standard_normal((d_in, H * d)).astype(dtype)
    b = rng.standard_normal(H * d).astype(dtype)
    assert_close(kernels.project_heads(X, W, b, H), ref.split_heads(X @ W + b, H), dtype)


@pytest.mark.parametrize("B, T, d_out, H, d_v", PROJECTIONS)
def test_merge_heads_project(kernels, B, T, d_out, H, d_v, dtype):
    rng = np.random.default_rng(3)
    O = rng.standard_normal((B, H, T, d_v)).astype(dtype)
    W_O = rng.standard_normal((H * d_v, d_out)).astype(dtype)
    b_O = rng.standard_normal(d_out).astype(dtype)
    assert_close(kernels.merge_heads_project(O, W_O, b_O), ref.merge_heads(O) @ W_O + b_O, dtype)


@pytest.mark.parametrize("T, d_model, base", [(1, 2, 10000.0), (9, 7, 10000.0), (6, 8, 100.0)])
def test_sinusoidal(kernels, T, d_model, base, dtype):
    PE = kernels.sinusoidal(T, d_model, base, dtype)
    assert_close(PE, ref.sinusoidal(T, d_model, base).astype(dtype), dtype)


# --- the lesson's own rules --------------------------------------------------------------------

def _functions(module):
    """``(name, lines)`` of every function in a module, decorators and docstring included."""
    tree = ast.parse(inspect.getsource(module))
    return [(node.name, node.end_lineno - min([node.lineno] + [d.lineno for d in node.decorator_list]) + 1)
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


@pytest.mark.parametrize("module", [lesson_cpu, lesson_gpu], ids=["cpu", "gpu"])
def test_every_function_fits_on_one_screen(module):
    too_long = [(name, n) for name, n in _functions(module) if n > 40]
    assert not too_long, f"over 40 lines: {too_long}"


def test_cpu_and_gpu_share_kernel_names_and_drivers():
    cpu_kernels = {name for name in vars(lesson_cpu) if name.endswith("_kernel")}
    gpu_kernels = {name for name in vars(lesson_gpu) if name.endswith("_kernel")}
    assert cpu_kernels == gpu_kernels and len(cpu_kernels) == 8
    for name in DRIVERS:
        assert inspect.signature(getattr(lesson_cpu, name)) == inspect.signature(getattr(lesson_gpu, name))


@pytest.mark.parametrize("module", [lesson_cpu, lesson_gpu], ids=["cpu", "gpu"])
def test_lesson_kernels_use_no_tricks(module):
    """No tuned helpers, no reference (product code never imports it), no fastmath, no parallel build."""
    tree = ast.parse(inspect.getsource(module))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    tricks = {"core.kernels.tuned.simd", "core.kernels.tuned.borrow", "core.kernels.tuned.floatbits", "core.kernels.tuned.fastexp", "core.kernels.reference",
              "numba.prange", "core.kernels.tuned.cpu", "core.kernels.tuned.tiles"}
    assert not imported & tricks
    options = {kw.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords}
    assert not options & {"fastmath", "parallel"}
