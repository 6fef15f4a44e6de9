"""Config of the flow-matching action-chunk policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_embodied.policies.shapes import PolicyShapesConfig


@dataclass
class FlowPolicyConfig(PolicyShapesConfig):
    """A small policy: image + state + task features condition a flow-matching action-chunk head.

    The data fills the shapes (``data=lerobot`` sets them from the dataset), so only the widths
    need choosing.

    Attributes:
        state_dim: Proprioceptive state size.
        action_dim: Action size.
        chunk_size: Actions predicted per step (action chunking).
        n_obs_steps: Frames of observation history.
        image_size: ``[C, H, W]`` of the cameras; None for state-only data.
        image_keys: Camera features read from the batch.
        num_tasks: Task embeddings (one per task of the dataset).
        hidden_size: Width of the encoders and the velocity network.
        num_layers: Residual MLP blocks of the velocity network.
        frequency_dim: Sinusoidal flow-time embedding width.
        num_inference_steps: Euler steps from noise to actions at inference.
    """

    hidden_size: int = 256
    num_layers: int = 3
    frequency_dim: int = 64
    num_inference_steps: int = 10
