"""The process's allocator, as ``import core`` sets it (:mod:`core.allocator`): a layer's arrays
are reused by the next layer, not handed back to the kernel and faulted in again."""
import subprocess
import sys
from pathlib import Path

import pytest

from core import allocator

ROOT = Path(__file__).resolve().parents[1]

# Eight arrays of 1.6 MB allocated, written and freed, as one layer of a forward pass does, twenty
# times; prints the page faults of the last twenty (a fresh process: the allocator as a server starts).
LAYERS = """
import resource, numpy as np
import core
def layer():
    arrays = [np.ones(400_000, np.float32) for _ in range(8)]
    del arrays
layer(); layer()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    layer()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
LAYER_PAGES = 8 * 400_000 * 4 // 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator is set on Linux only")
def test_a_layers_memory_is_reused_by_the_next_layer_not_faulted_in_again():
    assert allocator.keep_layer_memory()
    faults = int(subprocess.run([sys.executable, "-c", LAYERS], cwd=ROOT, capture_output=True, text=True,
                                check=True, timeout=120).stdout)
    # glibc's defaults fault every page of every layer in again: 20 x 3,125 pages (61,860 measured)
    assert faults < LAYER_PAGES, f"{faults} page faults in 20 layers of {LAYER_PAGES} pages each"
