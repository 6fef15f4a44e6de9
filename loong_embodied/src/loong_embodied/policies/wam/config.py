"""Config of the world-action model policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loong_core.errors import MissingDependencyError

try:
    from loong_diffusion.config import FlowMatchConfig
except ImportError as exc:  # the DiT and its objective come from loong-diffusion
    raise MissingDependencyError("loong_diffusion", "loong-embodied[wam]", "The wam policy") from exc
from loong_embodied.policies.shapes import PolicyShapesConfig


@dataclass
class WAMConfig(PolicyShapesConfig):
    """A policy that predicts a future camera latent and the action chunk with one DiT.

    The data fills the shapes; ``data.future_offset`` (frames ahead) chooses the future frame.
    Observation latents come from a fixed encoder: each camera image is average-pooled to
    ``latent_size`` squared pixels in [-1, 1] and cut into ``latent_patch`` squared patches.

    Attributes:
        state_dim: Proprioceptive state size.
        action_dim: Action size.
        chunk_size: Actions predicted per step (action chunking).
        n_obs_steps: Frames of state history (the latents read the current camera frame).
        image_size: ``[C, H, W]`` of the cameras (the policy needs at least one).
        image_keys: Camera features read from the batch.
        num_tasks: Task embeddings (one per task of the dataset).
        future_offset: Frames between the current and the predicted camera frame (set by the data).
        latent_size: Side of the pooled image latent (must divide the image side).
        latent_patch: Side of a latent patch (one token); must divide ``latent_size``.
        hidden_size: DiT width.
        num_layers: DiT blocks (loong_diffusion's ``DiTBlock``).
        num_attention_heads: Attention heads.
        mlp_ratio: MLP width / hidden size.
        frequency_dim: Sinusoidal flow-time embedding width.
        world_loss_weight: Weight of the future-latent flow loss beside the action flow loss.
        objective: Flow-time density, shift and loss weighting (loong_diffusion's objective).
        num_inference_steps: Euler steps from noise to actions at inference.
        world_rollout: Default of ``sample``: also denoise the future latents (False: the action
            tokens alone, FastWAM's test-time shortcut; the actions are the same either way).
        action_clip: Sampled (normalised) actions are clipped to ``[-action_clip, action_clip]``;
            None: no clipping.
    """

    future_offset: int = 0
    latent_size: int = 16
    latent_patch: int = 4
    hidden_size: int = 128
    num_layers: int = 4
    num_attention_heads: int = 4
    mlp_ratio: float = 4.0
    frequency_dim: int = 128
    world_loss_weight: float = 1.0
    objective: FlowMatchConfig = field(default_factory=lambda: FlowMatchConfig(num_train_timesteps=0))
    num_inference_steps: int = 10
    world_rollout: bool = False
    action_clip: Optional[float] = 1.0
