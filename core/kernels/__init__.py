"""Attention kernels.

- ``core.kernels.cpu``: lesson kernels for the CPU, one short ``@njit`` loop nest per operation;
- ``core.kernels.gpu``: lesson kernels for CUDA, the same operations under the same names;
- ``core.kernels.tuned.cpu``: the same operations as register-tiled SIMD kernels, for calls from code
  past a measured size (``core/kernels/tuned/target.py`` sizes them for the compile target);
- ``core.kernels.dispatch``: which of them runs a call (lesson pages: always the lesson kernels), and a
  record of the functions that ran;
- ``core.kernels.reference``: plain NumPy, written like the formulas; the tests' oracle, which
  product code never imports.

All three kernel modules implement the formulas of the reference and are tested against it. Their
host drivers share names and arguments (``scaled_scores``, ``attention_with_weights``,
``attention_with_scores``, ``weighted_sum``, ``fused_attention``, ``project_heads``,
``merge_heads_project``, ``sinusoidal``, ``warm_up``), so ``core.attention`` can run any of them.
"""
