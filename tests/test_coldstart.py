"""Cold start on a read-only install: Numba's cache falls back to a writable folder, and is reused.

A hosted demo often installs the code read-only. ``core/__init__.py`` then points
``NUMBA_CACHE_DIR`` at a writable folder (``$XDG_CACHE_HOME/attention-lab/numba``), so each kernel
compiles once per machine, not once per process. Here a copy of ``core/`` is made read-only in a
temporary folder and two fresh Python processes use it: the first must compile into the fallback
folder, the second must load every kernel from there (cache hits, no misses).

Root ignores permission bits, so under root the copy also gets a *file* named ``__pycache__``:
nothing can then be written beside the sources, exactly as on a read-only file system.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os
import numpy as np
import core                      # chooses the cache folder before Numba is imported
from core import attention, positional, validate
from core.kernels import cpu
from kernel_tables import cpu_kernels
X = np.random.default_rng(0).normal(size=(6, 4))
attention.attention(X, X, X, backend="cpu")            # lesson kernels: scores, mask, softmax, weighted sum
attention.attention(X, X, X, return_weights=False, backend="cpu")     # the fused lesson kernel
positional.sinusoidal(8, 6, backend="cpu")
compiled = cpu_kernels(cpu) | {validate._arrays_ok}
used = [k for k in compiled if k.signatures]
print(json.dumps({
    "cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
    "threading_layer": os.environ.get("NUMBA_THREADING_LAYER"),
    "kernels": len(used),
    "hits": sum(sum(k.stats.cache_hits.values()) for k in used),
    "misses": sum(sum(k.stats.cache_misses.values()) for k in used),
}))
"""


def run_python(args: list[str], what: str, *, guard_s: float = 800, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python *args`` to its end. ``guard_s`` only stops a hang (a busy machine is slow, not
    wrong): past it the test fails naming ``what`` it waited on and the last lines the child wrote."""
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=guard_s, **kwargs)
    except subprocess.TimeoutExpired as err:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                       for x in (err.stdout or "", err.stderr or ""))
        pytest.fail(f"still waiting after {guard_s:.0f} s on {what}; the child's last output:\n{said[-3000:]}")


def _read_only_copy(dest: Path) -> Path:
    app = dest / "app"
    shutil.copytree(ROOT / "core", app / "core", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if os.geteuid() == 0:
        (app / "core" / "__pycache__").write_text("not a folder: the install is read-only\n")
    for path in sorted(app.rglob("*"), reverse=True) + [app]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return app


def _run_child(app: Path, xdg: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_ENABLE_CUDASIM")}
    env.update(PYTHONPATH=os.pathsep.join([str(app), str(ROOT / "tests")]), XDG_CACHE_HOME=str(xdg), PYTHONDONTWRITEBYTECODE="1")
    proc = run_python(["-c", CHILD], "a fresh process running the lesson kernels from a read-only install",
                      cwd=app, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cache_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc")]


def test_read_only_install_falls_back_to_writable_cache(tmp_path):
    app = _read_only_copy(tmp_path)
    xdg = tmp_path / "xdg-cache"
    fallback = xdg / "attention-lab" / "numba"
    try:
        first = _run_child(app, xdg)
        assert first["cache_dir"] == str(fallback)
        assert first["threading_layer"] == "threadsafe"
        assert first["kernels"] >= 3 and first["misses"] >= first["kernels"]
        compiled = _cache_files(fallback)
        assert len(compiled) >= 2 * first["kernels"], compiled     # an index and a data file each
        assert _cache_files(app) == [], "nothing may be written beside read-only sources"

        second = _run_child(app, xdg)
        assert second["cache_dir"] == str(fallback)
        assert second["misses"] == 0, second
        # every kernel it runs comes from the cache (one called only from another compiled kernel,
        # like the steps of attention_steps, is loaded inside that one and counts for nothing here)
        assert second["kernels"] >= 3 and second["hits"] >= second["kernels"]
    finally:
        for path in [app] + list(app.rglob("*")):          # let pytest clean the folder up
            if path.is_dir() and not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_explicit_cache_dir_is_respected(tmp_path):
    """``NUMBA_CACHE_DIR`` set by the operator (the Dockerfile, a hosted app's settings) wins."""
    chosen = tmp_path / "chosen"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=str(chosen), PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    proc = run_python(["-c", "import core, os; print(os.environ['NUMBA_CACHE_DIR'])"], "importing core",
                      cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(chosen)


def test_streamlit_config_for_hosting():
    """``.streamlit/config.toml``: the upload cap is core.limits', nothing phones home, both themes work."""
    import tomllib

    from core import limits

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["server"]["maxUploadSize"] == limits.MAX_UPLOAD_MB
    assert config["server"]["headless"] is True
    assert config["server"]["runOnSave"] is False
    assert config["browser"]["gatherUsageStats"] is False
    assert "base" not in config.get("theme", {}), "a fixed base theme overrides students' light/dark choice"


def test_dockerfile_serves_what_the_app_needs():
    """The image (not buildable here: no Docker engine) keeps to the deployment notes."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "pip install -r requirements.txt" in text
    assert "NUMBA_CACHE_DIR=" in text and "bench.coldstart --warm-only" in text
    assert "EXPOSE 8501" in text and '"--server.address", "0.0.0.0"' in text
    assert "libgomp1" in text, "Numba's thread-safe OpenMP layer needs libgomp in the slim image"


LESSON_PAGE = r"""
import json, sys
from streamlit.testing.v1 import AppTest
page = AppTest.from_file(sys.argv[1], default_timeout=700).run()
assert not page.exception, [e.message for e in page.exception]
from core.kernels import cpu
from kernel_tables import cpu_kernels
print(json.dumps({
    "compiled": sorted({k.__name__ for k in cpu_kernels(cpu) if k.signatures}),
    "tuned_imported": "core.kernels.tuned.cpu" in sys.modules,
    "cuda_imported": "numba.cuda" in sys.modules,
}))
"""


@pytest.mark.compile
def test_a_lesson_page_compiles_only_the_lesson_kernels_it_runs(tmp_path):
    """On an empty cache, the one-head page compiles its lesson kernels (scores, mask, softmax,
    weighted sum, and attention_steps, which runs those four in one call) and nothing else: no
    other lesson kernel, and the tuned kernels are not even imported (nor is Numba's CUDA
    support, on a machine without a GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               ATTN_BACKEND="cpu")
    proc = run_python(["-c", LESSON_PAGE, str(ROOT / "views" / "one_head.py")],
                      "the one-head page's first run on an empty cache", cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ran = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ran["compiled"] == ["add_mask_kernel", "attention_steps", "scores_kernel", "softmax_kernel",
                               "weighted_sum_kernel"]
    assert not ran["tuned_imported"]
    assert not ran["cuda_imported"]


EMPTY_CACHE_PAGE = r"""
import json, os, sys, time
from streamlit.testing.v1 import AppTest
from core import warmup
warm = warmup.start_once()               # as app.py does on a server's first visit
print("warm-up started; the page runs", file=sys.stderr, flush=True)
at = AppTest.from_file("views/inside_model.py", default_timeout=700)
at.session_state["inside_model.data_sizes"] = (160, 40, 40)
at.session_state["inside_model.steps"] = 6
start = time.perf_counter()
at.run()
print(f"the page ran in {time.perf_counter() - start:.1f} s; warm-up at {warm.progress()}", file=sys.stderr, flush=True)
print(json.dumps({"seconds": time.perf_counter() - start, "encoder_loaded": warm.has_done(warmup.ENCODER),
                  "captions": [c.value for c in at.caption], "exceptions": [e.message for e in at.exception]}),
      flush=True)
# On a busy machine the page is drawn while the warm-up's thread still compiles the lesson kernels
# here; an interpreter shut down under a thread inside LLVM can crash or hang. The result is out:
# end the compiling child, then leave at once.
warm.stop_child()
os._exit(0)
"""


@pytest.mark.compile
def test_on_an_empty_cache_a_model_page_draws_on_the_readable_track(tmp_path):
    """A fresh server, nothing compiled: "Inside a trained model" draws at once, its default model
    trained on the readable step (which its caption names) while the compiled step still compiles."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), ATTN_WARMUP="1", PYTHONPATH=str(ROOT))
    out = run_python(["-c", EMPTY_CACHE_PAGE], "Inside a trained model's first run on an empty cache, beside "
                     "the warm-up", cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["exceptions"] == [] and not result["encoder_loaded"]
    caption = next(c for c in result["captions"] if c.startswith("Using the default model"))
    assert "trained on the readable training step" in caption
    print(f"drawn in {result['seconds']:.1f} s on an empty cache")
