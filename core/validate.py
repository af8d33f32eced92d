"""Input checks shared by the public operations: clear ``ValueError`` messages in the user's terms."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from core.kernels.tuned.floatbits import max_abs_bits

FLOAT_DTYPES = (np.float32, np.float64)
_FLOAT_DTYPE_SET = frozenset(np.dtype(t) for t in FLOAT_DTYPES)


def as_float_array(x, name: str, dtype=None) -> np.ndarray:
    """Convert ``x`` to a finite float32/float64 array.

    Integers and booleans are converted (to float64, or ``dtype``); complex, text and objects are
    refused; NaN and infinity are refused with the name of the offending input.
    """
    return as_float_array_with_peak(x, name, dtype)[0]


def as_float_array_with_peak(x, name: str, dtype=None) -> tuple[np.ndarray, float]:
    """:func:`as_float_array`, also returning ``max |x|`` (found by the same pass)."""
    try:
        arr = np.asarray(x)
    except Exception as err:  # ragged lists and the like
        raise ValueError(f"{name} is not a numeric array ({err}).") from None
    if arr.dtype.kind == "c":
        raise ValueError(f"{name} is complex; attention needs real numbers.")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must contain numbers, got values of type {arr.dtype}.")
    if dtype is None:
        dtype = arr.dtype if arr.dtype in FLOAT_DTYPES else np.float64
    arr = np.ascontiguousarray(arr, dtype=dtype)
    peak = max_abs(arr) if arr.size else 0.0
    if not math.isfinite(peak):
        bad = "NaN" if np.isnan(arr).any() else "an infinite value"
        raise ValueError(f"{name} contains {bad}; every entry must be a finite number.")
    return arr, peak


@njit(cache=True)
def _max_abs_flat(x):
    """Largest |x| of a flat float array (0 when empty); NaN or inf when an entry is."""
    return float(max_abs_bits(x)) if x.shape[0] else 0.0


@njit(cache=True)
def max_abs_of_each(a, b, c):
    """``(max |a|, max |b|, max |c|)`` for C-contiguous float arrays, in one compiled call
    (each non-finite when its array holds NaN or infinity)."""
    return _max_abs_flat(a.ravel()), _max_abs_flat(b.ravel()), _max_abs_flat(c.ravel())


@njit(cache=True)
def mask_values_ok(m):
    """No NaN and no +inf in a flat mask (0, finite numbers and -inf are allowed).

    Counts the bad entries over the whole mask instead of stopping at the first: a loop without an
    exit vectorises, which makes checking a (T, T) causal mask several times faster."""
    bad = 0
    for i in range(m.shape[0]):
        v = m[i]
        bad += (v != v) | (v == np.inf)
    return bad == 0


def max_abs(arr: np.ndarray) -> float:
    """``max |arr|`` for a contiguous float array; non-finite when any entry is NaN or infinite.

    Magnitudes are compared as integers (see :func:`core.kernels.tuned.floatbits.max_abs_bits`): the loop
    vectorises, 5-10x faster than a float loop that stops at the first non-finite entry."""
    return _max_abs_flat(arr.reshape(-1))


def same_float_arrays(*arrays) -> bool:
    """True when every input is already a C-contiguous float32 (or every one a float64) ndarray,
    so conversion can be skipped."""
    dtype = arrays[0].dtype if type(arrays[0]) is np.ndarray else None
    if dtype not in _FLOAT_DTYPE_SET:
        return False
    for x in arrays:
        if type(x) is not np.ndarray or x.dtype != dtype or not x.flags.c_contiguous:
            return False
    return True


def common_dtype(*arrays) -> np.dtype:
    """float32 only when every float input is float32; otherwise float64."""
    kinds = [np.asarray(a).dtype for a in arrays if a is not None]
    if kinds and all(k == np.float32 for k in kinds):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def require_ndim(arr: np.ndarray, name: str, low: int, high: int) -> None:
    if not low <= arr.ndim <= high:
        raise ValueError(f"{name} must have {low} to {high} dimensions, got shape {arr.shape}.")


def require_nonempty(arr: np.ndarray, name: str) -> None:
    if arr.size == 0 or 0 in arr.shape:
        raise ValueError(f"{name} is empty (shape {arr.shape}); a sequence needs at least one token.")


def check_heads(d_model: int, n_heads: int) -> int:
    """Return the head width ``d_model // n_heads``; refuse a head count that does not divide it."""
    if int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"The number of heads must be a positive whole number, got {n_heads}.")
    if d_model % n_heads:
        raise ValueError(
            f"d_model = {d_model} cannot be split evenly into {n_heads} heads "
            f"({d_model} / {n_heads} is not a whole number); pick a head count that divides d_model."
        )
    return d_model // n_heads


def parse_matrix(table, name: str, shape: tuple[int, int] | None = None, limit: float = 1e6) -> np.ndarray:
    """Read a matrix typed by a person (an editor's table, lists, strings) into a float64 array.

    Every cell must be a number with ``|x| <= limit``; the message names the first bad cell
    (1-based row and column) and what is wrong with it: blank, not a number, NaN, infinite, too large.
    """
    values = getattr(table, "values", table)      # a pandas DataFrame gives its cells
    rows = np.asarray(values, dtype=object)
    if rows.ndim != 2:
        raise ValueError(f"{name} must be a table of rows and columns, got {rows.ndim} dimension(s).")
    if shape is not None and rows.shape != tuple(shape):
        raise ValueError(f"{name} must be {shape[0]} x {shape[1]}, got {rows.shape[0]} x {rows.shape[1]}.")
    out = np.empty(rows.shape, dtype=np.float64)
    for (i, j), cell in np.ndenumerate(rows):
        where = f"{name}, row {i + 1}, column {j + 1}"
        if cell is None or (isinstance(cell, str) and not cell.strip()):
            raise ValueError(f"{where} is blank: type a number.")
        try:
            x = float(cell.strip() if isinstance(cell, str) else cell)
        except (TypeError, ValueError):
            raise ValueError(f"{where} holds {cell!r}, which is not a number.") from None
        if math.isnan(x):
            raise ValueError(f"{where} is blank or NaN: type a number.")
        if math.isinf(x):
            raise ValueError(f"{where} is infinite: type a finite number.")
        if abs(x) > limit:
            raise ValueError(f"{where} is {x:g}, beyond the limit of ±{limit:g}.")
        out[i, j] = x
    return out
