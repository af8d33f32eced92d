"""What one training run is: the task, the model's sizes and the optimiser's settings, checked
against ``core.limits`` before anything trains (``ui.trainer`` runs them; the page builds them)."""
from __future__ import annotations

import dataclasses

import numpy as np

from core import limits
from core.model.config import TransformerConfig
from core.training import encoder_runs as training
from core.validate import check_heads


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run: the task, the model's sizes and the optimiser's settings."""

    task: str = "sum"
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 32
    positional: str = "sinusoidal"
    lr: float = 3e-3
    steps: int = 300
    seed: int = 0
    label: str = "run"
    n_train: int = 4000
    n_val: int = 1000
    n_test: int = 1000
    batch_size: int = 64
    eval_every: int = 25

    def check(self) -> "RunSpec":
        """Refuse sizes beyond ``core.limits`` or a head count that does not divide d_model."""
        if not 1 <= int(self.n_layers) <= limits.MAX_TRAIN_LAYERS:
            raise ValueError(f"Layers must be between 1 and {limits.MAX_TRAIN_LAYERS}, got {self.n_layers}.")
        if not 1 <= int(self.d_model) <= limits.MAX_TRAIN_D_MODEL:
            raise ValueError(f"d_model must be between 1 and {limits.MAX_TRAIN_D_MODEL}, got {self.d_model}.")
        if not 1 <= int(self.n_heads) <= limits.MAX_TRAIN_HEADS:
            raise ValueError(f"Heads must be between 1 and {limits.MAX_TRAIN_HEADS}, got {self.n_heads}.")
        check_heads(int(self.d_model), int(self.n_heads))
        if not 1 <= int(self.steps) <= limits.MAX_TRAIN_STEPS:
            raise ValueError(f"Steps must be between 1 and {limits.MAX_TRAIN_STEPS}, got {self.steps}.")
        if not (np.isfinite(self.lr) and 0 < self.lr <= 1):
            raise ValueError(f"The learning rate must be in (0, 1], got {self.lr}.")
        return self

    def config(self) -> TransformerConfig:
        """The encoder classifier this spec trains (feed-forward width 2 d_model, as the default 32 -> 64)."""
        return training.config_for(self.task, d_model=int(self.d_model), n_heads=int(self.n_heads),
                                   d_ff=2 * int(self.d_model), n_layers=int(self.n_layers),
                                   positional=self.positional)
