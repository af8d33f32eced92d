"""Input checks shared by the public operations: clear ``ValueError`` messages in the user's terms."""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from core.kernels.tuned.floatbits import max_abs_bits

FLOAT_DTYPES = (np.float32, np.float64)
_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def as_float_array(x, name: str, dtype=None) -> np.ndarray:
    """Convert ``x`` to a finite float32/float64 array.

    Integers and booleans are converted (to float64, or ``dtype``); complex, text and objects are
    refused; NaN and infinity are refused with the name of the offending input.
    """
    arr = _as_float(x, name, dtype)
    if arr.size:
        _require_finite(max_abs(arr), arr, name)
    return arr


def _as_float(x, name: str, dtype=None) -> np.ndarray:
    """``x`` as a C-contiguous float array of ``dtype`` (default: its own float type, else
    float64), or a ``ValueError`` naming ``x`` when it does not hold real numbers."""
    if dtype is not None and type(x) is np.ndarray and x.dtype == dtype and x.flags.c_contiguous:
        return x                                   # already what the kernels take: no copy
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
    return np.ascontiguousarray(arr, dtype=dtype)


def _require_finite(peak: float, arr: np.ndarray, name: str) -> None:
    """Refuse ``arr`` when its ``max |arr|`` is NaN or infinite, saying which."""
    if not math.isfinite(peak):
        bad = "NaN" if np.isnan(arr).any() else "an infinite value"
        raise ValueError(f"{name} contains {bad}; every entry must be a finite number.")


@njit(cache=True)
def _max_abs_flat(x):
    """Largest |x| of a flat float array (0 when empty); NaN or inf when an entry is."""
    return float(max_abs_bits(x)) if x.shape[0] else 0.0


def max_abs(arr: np.ndarray) -> float:
    """``max |arr|`` for a contiguous float array; non-finite when any entry is NaN or infinite.

    Magnitudes are compared as integers (see :func:`core.kernels.tuned.floatbits.max_abs_bits`): the loop
    vectorises, 5-10x faster than a float loop that stops at the first non-finite entry."""
    return _max_abs_flat(arr.reshape(-1))


# --- the inputs of attention: one set of rules --------------------------------------------------


_NO_MASK = {np.dtype(t): np.zeros((1, 1, 1, 1), t) for t in FLOAT_DTYPES}
# The kernels add scores and mask values in the data's dtype: scores below a quarter of its
# largest number leave room for those additions without reaching infinity.
_LARGEST = {np.dtype(t): float(np.finfo(t).max) / 4 for t in FLOAT_DTYPES}


def attention_inputs(Q, K, V, mask=None, scale=None):
    r"""Check the inputs of scaled dot-product attention and lay them out for the kernels.

    The rules, in the order a broken one is reported:

    1. numbers: Q, K and V hold real numbers (integers and booleans are converted); the result
       is float32 when all three are float32, else float64;
    2. shapes: 2 to 4 axes, none empty; Q, K and V share their leading (batch, head) axes,
       Q and K their width :math:`d_k`, K and V their number of keys;
    3. the mask: numeric (0 where a query may look, -inf where not) or boolean (True where it may),
       broadcastable to ``(B, H, Tq, Tk)``;
    4. the scale: a finite number (default :math:`1/\sqrt{d_k}`);
    5. values: Q, K and V finite, the mask free of NaN and +inf, and the scores
       :math:`|q \cdot k| \cdot scale` well inside the dtype.

    The shapes and values of all four arrays are checked together, by :func:`check_arrays`'s one
    compiled pass: at the lesson pages' sizes (a few dozen numbers) the checks then cost about
    what the attention itself does. Each broken rule raises a ``ValueError`` that names it.

    Returns
    -------
    Q, K, V : C-contiguous ``(B, H, Tq, d_k)``, ``(B, H, Tk, d_k)``, ``(B, H, Tk, d_v)``
        views of the inputs when they were already contiguous arrays of the dtype, else copies.
    mask : C-contiguous ``(Bm, Hm, Tqm, Tkm)``, additive, each axis 1 or full size.
    scale : float
    lead : tuple, the inputs' leading axes (``()``, ``(B,)`` or ``(B, H)``), to shape the results.
    """
    # 1. numbers, in one dtype
    dtype = _kernel_ready(Q, K, V)
    if dtype is None:                                      # anything else: convert (or refuse)
        dtype = common_dtype(Q, K, V)
        Q, K, V = _as_float(Q, "Q", dtype), _as_float(K, "K", dtype), _as_float(V, "V", dtype)
    given = Q, K, V                                        # as given: the results' leading axes, messages
    # 2. the kernels' layout, (B, H, T, d): axes of length 1 in front where the inputs have fewer
    n = Q.ndim
    if not (2 <= n <= 4 and K.ndim == n and V.ndim == n):
        check_shapes(Q, K, V)                              # raises: names the rule broken
    if n < 4:
        front = (None,) * (4 - n)                          # new axes of length 1, views of the same data
        Q, K, V = Q[front], K[front], V[front]             # (B, H, T, d)
    # 3. the mask, as a 4-D additive array
    mask = _NO_MASK[dtype] if mask is None else additive_mask(mask, dtype)
    # 4. the scale
    scale = 1.0 / math.sqrt(max(Q.shape[3], 1)) if scale is None else score_scale(scale)   # d_k = 0: refused next
    # 2.-5. shapes and values, in one compiled pass
    check_arrays(Q, K, V, mask, scale, given=given)
    return Q, K, V, mask, scale, given[0].shape[:-2]


def _kernel_ready(Q, K, V):
    """The dtype of Q, K and V when all three are C-contiguous float arrays of one float dtype,
    as the kernels take them, else None. The common case, told apart in about a microsecond less
    than :func:`common_dtype` and three :func:`_as_float` calls take to find that nothing changes."""
    if type(Q) is np.ndarray and type(K) is np.ndarray and type(V) is np.ndarray:
        dtype = Q.dtype
        if ((dtype is _FLOAT32 or dtype is _FLOAT64) and K.dtype is dtype and V.dtype is dtype
                and Q.flags.c_contiguous and K.flags.c_contiguous and V.flags.c_contiguous):
            return dtype
    return None


def check_shapes(Q, K, V) -> None:
    """The shape rules of :func:`attention_inputs` one by one, on the arrays as given: raise a
    ``ValueError`` for the first one broken."""
    for x, name in ((Q, "Q"), (K, "K"), (V, "V")):
        require_ndim(x, name, 2, 4)
        require_nonempty(x, name)
    if not Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]:
        raise ValueError(f"Q, K and V must share their batch/head axes; got shapes {Q.shape}, {K.shape}, {V.shape}.")
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Queries and keys must have the same width d_k: Q has {Q.shape[-1]}, K has {K.shape[-1]}.")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K and V must have one row per key position: K has {K.shape[-2]}, V has {V.shape[-2]}.")


def additive_mask(mask, dtype) -> np.ndarray:
    """``mask`` as a C-contiguous 4-D additive mask of ``dtype`` (None means no mask): boolean masks
    mean "may attend" where True (as in PyTorch) and become 0 / -inf, and axes of length 1 are put
    in front up to four. Whether it broadcasts to the scores ``(B, H, Tq, Tk)``, and its values,
    are for :func:`check_arrays`."""
    if mask is None:
        return _NO_MASK[np.dtype(dtype)]
    m = mask if type(mask) is np.ndarray else np.asarray(mask)
    if m.dtype != dtype:                                  # booleans, integers, the other float
        if m.dtype.kind == "b":
            m = np.where(m, 0.0, -np.inf)
        elif m.dtype.kind not in "iuf":
            raise ValueError(f"The mask must be numeric (0 where allowed, -inf where not), got {m.dtype}.")
        m = np.ascontiguousarray(m, dtype=dtype)
    elif not m.flags.c_contiguous:
        m = np.ascontiguousarray(m)
    if m.ndim > 4:
        raise ValueError(f"The mask has shape {m.shape}, which does not broadcast to the attention "
                         f"scores' four axes (batch, heads, queries, keys).")
    return m[(None,) * (4 - m.ndim)]                      # (Bm, Hm, Tqm, Tkm)


def score_scale(scale) -> float:
    """The factor given for the scores, as a float; it must be a finite number."""
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"The score scale must be a finite number, got {scale!r}.") from None
    if not math.isfinite(value):
        raise ValueError(f"The score scale must be a finite number, got {scale}.")
    return value


def check_arrays(Q, K, V, mask, scale: float, *, given=None, computed_from: str | None = None) -> None:
    r"""Steps 2, 3 and 5 of :func:`attention_inputs` on the kernels' layout, in one compiled pass:
    Q, K and V non-empty, agreeing in shape and finite; the mask broadcastable and free of NaN and
    +inf; and the scores well inside the dtype.

    The scores fit when :math:`\max|Q| \cdot |scale| \cdot \max(\max|K| \cdot d_k, 1)` stays below
    a quarter of the dtype's largest number, which bounds :math:`|q \cdot k| \cdot scale` and also
    ``Q * scale`` (the tuned kernels scale the queries before the dot products): beyond it,
    ``inf - inf`` would give NaN weights. All four arrays are C-contiguous, 4-D, of one float
    dtype; from ``PARALLEL_CHECK_MIN`` numbers on, the threads share the pass. ``given`` holds Q, K
    and V as the caller gave them (for the messages); ``computed_from`` names what Q, K and V were
    computed from (multi-head attention's projections), for the message when they overflowed on
    the way.
    """
    if Q.size + K.size + V.size + mask.size >= PARALLEL_CHECK_MIN and (threads := numba.get_num_threads()) > 1:
        ok = _arrays_ok_parallel(Q, K, V, mask, abs(scale), _LARGEST[Q.dtype], threads)
    else:
        ok = _arrays_ok(Q, K, V, mask, abs(scale), _LARGEST[Q.dtype])
    if not ok:
        _refuse_arrays(Q, K, V, mask, scale, given or (Q, K, V), computed_from)


@njit(cache=True)
def _arrays_ok(Q, K, V, mask, scale, limit):
    """Every rule of :func:`check_arrays` at once (NaN fails every comparison)."""
    if not _shapes_agree(Q, K, V, mask):
        return False
    peak_Q, peak_K, peak_V = _max_abs_flat(Q.ravel()), _max_abs_flat(K.ravel()), _max_abs_flat(V.ravel())
    return _values_ok(peak_Q, peak_K, peak_V, _any_bad_entry(mask.ravel()), Q.shape[3], scale, limit)


# From this many numbers (Q, K, V and the mask together) the threads share the scan of the values:
# 8 heads of T = 512 (4 MiB with a causal mask) took 120 us on one thread, 58-64 us on two; below
# about a million bytes, starting the parallel region (some 5 us here) costs more than it saves.
PARALLEL_CHECK_MIN = 1 << 18


@njit(parallel=True, cache=True)
def _arrays_ok_parallel(Q, K, V, mask, scale, limit, parts):
    """:func:`_arrays_ok` with each array read in ``parts`` pieces, shared among the threads."""
    if not _shapes_agree(Q, K, V, mask):
        return False
    arrays = (Q.ravel(), K.ravel(), V.ravel(), mask.ravel())
    found = np.zeros((4, parts))               # per piece: max |x| of Q, K, V; whether the mask's is bad
    for c in prange(4 * parts):
        a, p = c // parts, c % parts
        x = arrays[a]
        piece = x[p * x.shape[0] // parts:(p + 1) * x.shape[0] // parts]
        found[a, p] = _any_bad_entry(piece) if a == 3 else _max_abs_flat(piece)
    # the pieces' peaks reduced as integers too: a NaN in any piece stays NaN
    peak_Q, peak_K, peak_V = _max_abs_flat(found[0]), _max_abs_flat(found[1]), _max_abs_flat(found[2])
    return _values_ok(peak_Q, peak_K, peak_V, found[3].any(), Q.shape[3], scale, limit)


@njit(inline="always")
def _shapes_agree(Q, K, V, mask):
    """Q, K and V non-empty and of agreeing shapes; the mask broadcastable to the scores."""
    B, H, Tq, d_k = Q.shape
    Tk = K.shape[2]
    if not (Q.size > 0 and K.size > 0 and V.size > 0 and K.shape[0] == B and V.shape[0] == B
            and K.shape[1] == H and V.shape[1] == H and K.shape[3] == d_k and V.shape[2] == Tk):
        return False
    Bm, Hm, Tqm, Tkm = mask.shape
    return (Bm == 1 or Bm == B) and (Hm == 1 or Hm == H) and (Tqm == 1 or Tqm == Tq) and (Tkm == 1 or Tkm == Tk)


@njit(inline="always")
def _values_ok(peak_Q, peak_K, peak_V, bad_mask, d_k, scale, limit):
    """No bad mask entry, V finite and the scores' bound within ``limit``."""
    return not bad_mask and peak_V < np.inf and peak_Q * scale * max(peak_K * d_k, 1.0) <= limit


@njit(inline="always")
def _any_bad_entry(m):
    """Whether a flat mask holds NaN or +inf. No early exit, and an 'or' rather than a count: the
    loop vectorises, and a float32 (256, 256) mask takes 2.6 us against 8.5 us counting them."""
    bad = False
    for i in range(m.shape[0]):
        v = m[i]
        bad |= (v != v) | (v == np.inf)
    return bad


def _refuse_arrays(Q, K, V, mask, scale: float, given, computed_from: str | None) -> None:
    """:func:`check_arrays` rule by rule: raise for the first one broken."""
    check_shapes(*given)
    scores_shape = Q.shape[:3] + (K.shape[2],)
    if any(m not in (1, n) for m, n in zip(mask.shape, scores_shape)):
        raise ValueError(f"The mask has shape {mask.shape}, which does not broadcast to the attention "
                         f"scores' shape {scores_shape} (batch, heads, queries, keys).")
    peaks = []
    for x, name in ((Q, "Q"), (K, "K"), (V, "V")):
        peak = max_abs(x)
        if computed_from and not math.isfinite(peak):
            raise ValueError(f"{name} = {computed_from} overflows {x.dtype}: use smaller values or float64.")
        _require_finite(peak, x, name)
        peaks.append(peak)
    if np.isnan(mask).any() or (mask == np.inf).any():
        raise ValueError("The mask may hold 0, finite numbers or -inf, but not NaN or +inf.")
    bound = peaks[0] * abs(scale) * max(peaks[1] * Q.shape[3], 1.0)
    raise ValueError(
        f"Q and K are too large: their scores could reach {bound:.3g}, beyond what {Q.dtype} holds "
        f"({_LARGEST[Q.dtype]:.3g}). Use smaller values or float64.")


def warm_up(dtype) -> None:
    """Compile (or load from the disk cache) the input checks for one dtype."""
    x = np.ones((1, 1, 1, 1), dtype)
    check_arrays(x, x, x, _NO_MASK[np.dtype(dtype)], 1.0)
    max_abs(x)


def common_dtype(*arrays) -> np.dtype:
    """float32 only when every input (None aside) is float32; otherwise float64."""
    dtype = _FLOAT64
    for a in arrays:
        if a is None:
            continue
        try:
            kind = a.dtype if type(a) is np.ndarray else np.asarray(a).dtype
        except Exception:          # not an array at all: the conversion names it
            return _FLOAT64
        if kind != _FLOAT32:
            return _FLOAT64
        dtype = _FLOAT32
    return dtype


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
        out[i, j] = parse_cell(cell, f"{name}, row {i + 1}, column {j + 1}", limit)
    return out


def parse_cell(cell, where: str, limit: float) -> float:
    """One typed cell as a float with ``|x| <= limit``; the ``ValueError`` starts with ``where``."""
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
        raise ValueError(f"{where} is {x:g}, beyond the limit of ±{limit:,g}.")
    return x
