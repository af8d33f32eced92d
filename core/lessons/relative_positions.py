"""Relative position schemes, which act on the attention scores instead of the embeddings:

- ``rope_*``: rotary embeddings, which rotate query and key pairs by position so that a score
  depends on the offset between the two positions only;
- ``alibi_*``: a per-head penalty growing linearly with distance, added to the scores.
"""
from __future__ import annotations

import numpy as np

from core.positional import _check_length_width
from core.validate import as_float_array, require_ndim


def _check_pairs(X: np.ndarray, name: str) -> None:
    if X.shape[-1] % 2:
        raise ValueError(f"RoPE rotates feature pairs, so {name} needs an even width d_k; got {X.shape[-1]}.")


def rope_angles(positions, d_k: int, base: float = 10000.0) -> np.ndarray:
    """Rotation angle of each feature pair at each position, ``(len(positions), d_k / 2)``.

    ``theta[p, i] = p * base**(-2i / d_k)``: the same frequencies as the sinusoidal code.
    """
    freqs = base ** (-np.arange(0, d_k, 2) / d_k)                  # (d_k/2,)
    return np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]


def rope_rotate(X, positions=None, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding (Su et al. 2021): rotate each feature pair by its position's angle.

    For pair ``(x_{2i}, x_{2i+1})`` of the vector at position ``p``:
    ``x'_{2i} = x_{2i} cos(theta) - x_{2i+1} sin(theta)``,
    ``x'_{2i+1} = x_{2i} sin(theta) + x_{2i+1} cos(theta)``, ``theta = p * base**(-2i/d_k)``.

    Parameters
    ----------
    X : array_like, shape (..., T, d_k), d_k even
    positions : sequence of int, optional
        Position of each row (default ``0..T-1``).

    Returns
    -------
    ndarray, shape (..., T, d_k)
    """
    X = as_float_array(X, "The vectors to rotate", dtype=np.float64)
    require_ndim(X, "The vectors to rotate", 2, 4)
    _check_pairs(X, "the input")
    T, d_k = X.shape[-2:]
    positions = np.arange(T) if positions is None else np.asarray(positions)
    if positions.shape != (T,):
        raise ValueError(f"Need one position per row: {T} positions, got shape {positions.shape}.")
    theta = rope_angles(positions, d_k, base)                       # (T, d_k/2)
    cos, sin = np.cos(theta), np.sin(theta)
    even, odd = X[..., 0::2], X[..., 1::2]                          # (..., T, d_k/2)
    out = np.empty_like(X)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def rope_scores(Q, K, base: float = 10000.0, scale: float | None = None) -> np.ndarray:
    """Scaled scores after rotating queries and keys by their positions, ``(..., Tq, Tk)``.

    ``S[m, n] = R(m) q_m . R(n) k_n * scale = q_m . R(n - m) k_n * scale`` (rotations compose), so
    the position enters only through the offset ``n - m``. No mask is added.
    """
    Q, K = as_float_array(Q, "Q", np.float64), as_float_array(K, "K", np.float64)
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q and K must share d_k; got shapes {Q.shape} and {K.shape}.")
    scale = 1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale
    Qr, Kr = rope_rotate(Q, base=base), rope_rotate(K, base=base)
    return (Qr @ np.swapaxes(Kr, -1, -2)) * scale


def rope_offset_scores(q, k, offset: int, positions, base: float = 10000.0) -> np.ndarray:
    """``R(p + offset) q . R(p) k`` for each ``p`` in ``positions``: equal for every ``p``; ``(n,)``.

    One query vector and one key vector, placed ``offset`` apart at different absolute positions.
    """
    q = as_float_array(q, "q", np.float64).reshape(1, -1)
    k = as_float_array(k, "k", np.float64).reshape(1, -1)
    out = []
    for p in positions:
        qr = rope_rotate(q, positions=[p + offset], base=base)[0]
        kr = rope_rotate(k, positions=[p], base=base)[0]
        out.append(qr @ kr)
    return np.asarray(out)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi slopes (Press et al. 2022): ``m_h = 2 ** (-8 h / H)`` for ``h = 1..H``; ``(H,)``.

    A geometric sequence from ``2**(-8/H)`` down to ``2**-8``: steep heads look locally, shallow
    heads far. (The paper defines it this way for ``H`` a power of two.)
    """
    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"The number of heads must be a positive whole number, got {n_heads}.")
    h = np.arange(1, int(n_heads) + 1)
    return 2.0 ** (-8.0 * h / n_heads)


def alibi_bias(n_heads: int, Tq: int, Tk: int | None = None) -> np.ndarray:
    """ALiBi's additive bias ``B[h, i, j] = -m_h |i - j|``, ``(H, Tq, Tk)``.

    Under a causal mask only ``j <= i`` survives, where this is the paper's ``m_h (j - i)``.
    """
    Tk = Tq if Tk is None else Tk
    _check_length_width(Tq, Tk)
    distance = np.abs(np.arange(Tq)[:, None] - np.arange(Tk)[None, :])   # (Tq, Tk)
    return -alibi_slopes(n_heads)[:, None, None] * distance[None, :, :]


def alibi_scores(Q, K, n_heads: int, scale: float | None = None) -> np.ndarray:
    """Scaled scores plus the ALiBi bias: ``S_h = Q_h K_h^T * scale - m_h |i - j|``, ``(H, Tq, Tk)``.

    ``Q (Tq, d_k)`` and ``K (Tk, d_k)`` shared by every head, or one per head: ``(H, T, d_k)``.
    No positional code is added to the inputs; the bias alone tells heads about distance.
    """
    Q, K = as_float_array(Q, "Q", np.float64), as_float_array(K, "K", np.float64)
    require_ndim(Q, "Q", 2, 3)
    require_ndim(K, "K", 2, 3)
    for name, M in (("Q", Q), ("K", K)):
        if M.ndim == 3 and M.shape[0] != n_heads:
            raise ValueError(f"{name} has {M.shape[0]} heads but n_heads = {n_heads}.")
    if Q.shape[-1] != K.shape[-1]:
        raise ValueError(f"Q and K must share d_k; got shapes {Q.shape} and {K.shape}.")
    scale = 1.0 / np.sqrt(Q.shape[-1]) if scale is None else scale
    S = (Q @ np.swapaxes(K, -1, -2)) * scale                          # (Tq, Tk) or (H, Tq, Tk)
    return S + alibi_bias(n_heads, Q.shape[-2], K.shape[-2])         # (H, Tq, Tk)
