"""Choosing the next token from the model's logits: temperature, top-k, top-p (nucleus), greedy.

The sampler works on one row of logits ``(V,)`` at a time:

1. temperature ``tau``: ``p = softmax(logits / tau)``; ``tau -> 0`` tends to the argmax, and
   ``tau = 0`` is exactly greedy decoding (the argmax, first index on ties);
2. top-k: keep the ``k`` most likely tokens (ties broken by the lower id);
3. top-p: of what is left, keep the nucleus, the shortest prefix of the most likely tokens whose
   cumulative mass is ``>= p`` (renormalised after top-k, as most libraries do). With
   probabilities ``(1/2, 1/4, 1/4)`` and ``p = 0.75`` that is two tokens. A mass counts as reaching
   ``p`` when it falls short by no more than ``TOP_P_SLACK``: the softmax rounds, and rounding must
   not add a token to the nucleus. ``p = 1`` keeps every token, even one whose probability
   rounds to zero;
4. renormalise over the kept tokens and draw one with the caller's ``numpy.random.Generator``.

Randomness comes only from the generator passed in, never from NumPy's global state, so a seed
gives the same tokens every time.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

# How far below p a cumulative mass may fall and still count as reaching it: the softmax and the
# running sum round, and can leave a mass that is exactly p a few units in the last place short.
TOP_P_SLACK = 1e-12


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """Checked sampler settings (``ValueError`` in the user's terms on bad input)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {t!r}.")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
            raise ValueError(f"top_k must be a whole number >= 1 (or None for no limit), got {k!r}.")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real)
                              or not math.isfinite(p) or not 0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token; None for no limit), got {p!r}.")


def distribution(logits, settings: SamplerSettings) -> tuple[np.ndarray, np.ndarray]:
    """The distribution the sampler draws from, and which tokens it may pick.

    Parameters
    ----------
    logits : (V,) finite numbers
    settings : SamplerSettings

    Returns
    -------
    probs : (V,) float64, zero outside ``allowed``, summing to 1
    allowed : (V,) bool
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 1 or z.size == 0 or not np.isfinite(z).all():
        raise ValueError("logits must be a non-empty 1-D array of finite numbers.")
    V = z.size
    # 1. temperature; tau = 0 is greedy: all the mass on the first argmax
    if settings.temperature == 0:
        allowed = np.zeros(V, dtype=bool)
        allowed[int(np.argmax(z))] = True
        return allowed.astype(np.float64), allowed
    e = np.exp((z - z.max()) / settings.temperature)               # the max maps to exp(0) = 1
    probs = e / e.sum()
    order = np.argsort(-z, kind="stable")                          # most likely first, lower id on ties
    keep = V
    # 2. top-k
    if settings.top_k is not None:
        keep = min(keep, int(settings.top_k))
    # 3. top-p on the (renormalised) survivors of top-k: the shortest prefix whose mass is >= p
    if settings.top_p is not None and settings.top_p < 1:
        head = probs[order[:keep]]
        mass = np.cumsum(head) / head.sum()                        # non-decreasing
        reached = int(np.searchsorted(mass, settings.top_p - TOP_P_SLACK, side="left"))
        keep = min(keep, reached + 1)
    allowed = np.zeros(V, dtype=bool)
    allowed[order[:keep]] = True
    # 4. renormalise over the kept tokens
    probs = np.where(allowed, probs, 0.0)
    return probs / probs.sum(), allowed


def sample(logits, settings: SamplerSettings, rng: np.random.Generator) -> tuple[int, np.ndarray, np.ndarray]:
    """Draw one token id from :func:`distribution`; returns ``(token, probs, allowed)``.

    The draw inverts the cumulative distribution of the allowed tokens only, so rounding can never
    pick a token the filters removed.
    """
    probs, allowed = distribution(logits, settings)
    ids = np.flatnonzero(allowed)
    cdf = np.cumsum(probs[ids])
    j = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(ids[min(j, ids.size - 1)]), probs, allowed
