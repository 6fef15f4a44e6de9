"""Config fields of every policy that the dataset fills (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loong_core.config.schema import ModelConfig


@dataclass
class PolicyShapesConfig(ModelConfig):
    """Shapes a policy reads and predicts; ``data=lerobot`` sets them from the dataset.

    Attributes:
        state_dim: Proprioceptive state size.
        action_dim: Action size.
        chunk_size: Actions predicted per step (action chunking).
        n_obs_steps: Frames of observation (state) history.
        image_size: ``[C, H, W]`` of the cameras; None for state-only data.
        image_keys: Camera features read from the batch.
        num_tasks: Tasks of the dataset.
    """

    state_dim: int = 39
    action_dim: int = 4
    chunk_size: int = 16
    n_obs_steps: int = 1
    image_size: Optional[list[int]] = None
    image_keys: list[str] = field(default_factory=list)
    num_tasks: int = 1
