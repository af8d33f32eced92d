"""Test setup shared by every test module.

The CUDA kernels run through Numba's CUDA simulator unless a real NVIDIA GPU is present; the
variable must be set before Numba is first imported, which is why it lives here.
"""
import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# No background compile (core/warmup.py) in test processes and the servers they start: tests that
# time things or count compiled kernels must not share the CPU with it. tests/test_warmup.py drives
# the warm-up itself.
os.environ.setdefault("ATTN_WARMUP", "0")
