"""The sinusoidal positional encoding, the public operation (computed by our Numba kernels).

The lessons about positions (learned tables, RoPE, ALiBi, the measures of a code, order blindness)
are in ``core.lessons.positions``.
"""
from __future__ import annotations

import numpy as np

from core.kernels import dispatch
from core.validate import FLOAT_DTYPES

# ---------------------------------------------------------------------------------------------
# absolute encodings
# ---------------------------------------------------------------------------------------------


def _check_length_width(T, d_model) -> tuple[int, int]:
    """``T`` and ``d_model`` as positive Python ints, or a ``ValueError`` saying which is wrong."""
    for name, v in (("The number of positions T", T), ("d_model", d_model)):
        try:
            whole = not isinstance(v, bool) and int(v) == v and v >= 1
        except (TypeError, ValueError):
            whole = False
        if not whole:
            raise ValueError(f"{name} must be a whole number of at least 1, got {v!r}.")
    return int(T), int(d_model)


def sinusoidal(T: int, d_model: int, base: float = 10000.0, *, backend: str | None = None,
               dtype=np.float64) -> np.ndarray:
    """Sinusoidal positional encoding of Vaswani et al. (2017), computed by the chosen backend.

    ``PE[p, 2i] = sin(p / base**(2i/d))``, ``PE[p, 2i+1] = cos(p / base**(2i/d))`` for positions
    ``p = 0..T-1``. Each pair of columns is a clock at its own frequency, from one turn every
    ``2 pi`` positions (column 0) to one every ``2 pi base`` positions.

    Parameters
    ----------
    T : int
        Number of positions (at least 1).
    d_model : int
        Width of the code (at least 1; with an odd width the last column is a sine alone).
    base : float
        Ratio of the slowest to the fastest wavelength scale; must exceed 1.
    backend : {"cpu", "cuda", "auto"}, optional
        Which kernels compute it (default: ``ATTN_BACKEND``, else auto).
    dtype : float32 or float64

    Returns
    -------
    ndarray, shape (T, d_model)
    """
    T, d_model = _check_length_width(T, d_model)
    try:
        base = float(base)
    except (TypeError, ValueError):
        raise ValueError(f"The base must be a number greater than 1, got {base!r}.") from None
    if not np.isfinite(base) or base <= 1.0:
        raise ValueError(f"The base must be a finite number greater than 1 (10000 in the original "
                         f"Transformer), got {base}.")
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    return dispatch.run(backend, T * d_model, "sinusoidal", T, d_model, base, dtype)   # (T, d_model)
