"""Attention kernels.

- ``core.kernels.cpu``: lesson kernels for the CPU, one short ``@njit`` loop nest per operation;
- ``core.kernels.gpu``: lesson kernels for CUDA, the same operations under the same names.

Both implement the formulas of ``core/kernels/reference.py`` and are tested against it. Their host
drivers share names and arguments (``scaled_scores``, ``attention_with_weights``, ``weighted_sum``,
``fused_attention``, ``project_heads``, ``merge_heads_project``, ``sinusoidal``, ``warm_up``), so
``core.attention`` can run either.
"""
