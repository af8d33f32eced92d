"""Adam, the one optimiser every model trains with, on one flat parameter buffer.

The update is one compiled call (``core.model.tuned.elementwise.adam_update``), in the buffer's dtype.
Each model passes its own betas (the encoder (0.9, 0.999), the decoders (0.9, 0.98), as in the
original Transformer).
"""
from __future__ import annotations

import numpy as np

from core.model.tuned import elementwise


class Adam:
    """Adam (Kingma & Ba) with bias correction, on one flat parameter buffer.

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
    ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1-b1^t)``, ``v_hat = v / (1-b2^t)``.
    """

    def __init__(self, size: int, dtype=np.float32, lr: float = 3e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(betas[0]), float(betas[1]), float(eps)
        self.m = np.zeros(size, dtype=dtype)
        self.v = np.zeros(size, dtype=dtype)
        self.t = 0

    def step(self, flat_params: np.ndarray, flat_grads: np.ndarray, lr: float | None = None) -> None:
        """Update ``flat_params`` in place from ``flat_grads`` (``lr``, if given, replaces the base
        rate for this step: a schedule)."""
        self.t += 1
        rate = self.lr if lr is None else float(lr)
        elementwise.adam_update(flat_params, flat_grads, self.m, self.v, rate, self.beta1, self.beta2, self.eps, self.t)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Adam":
        opt = cls(state["m"].size, state["m"].dtype, state["lr"], (state["beta1"], state["beta2"]), state["eps"])
        opt.m[:] = state["m"]
        opt.v[:] = state["v"]
        opt.t = int(state["t"])
        return opt
