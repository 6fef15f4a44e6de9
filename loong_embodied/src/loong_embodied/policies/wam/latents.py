"""The fixed observation encoder of the world-action model: pooled, patchified camera frames.

A fixed encoder keeps the world target still while the DiT learns (a learned encoder trained by
the same loss could collapse the target to a constant); pooling keeps the token count small.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loong_core.errors import ConfigError
from loong_diffusion.families.dit.model import patchify
from loong_embodied.policies.wam.config import WAMConfig


def latent_tokens(image: torch.Tensor, latent_size: int, patch: int) -> torch.Tensor:
    """The fixed observation encoder: ``image [B, C, H, W]`` (or ``[B, T, C, H, W]``, last frame)
    in [0, 1] -> average-pooled to ``latent_size`` squared, scaled to [-1, 1], patchified into
    tokens ``[B, (latent_size / patch)^2, C * patch^2]``."""
    image = image.float()
    if image.dim() == 5:
        image = image[:, -1]
    return patchify(F.adaptive_avg_pool2d(image, latent_size) * 2.0 - 1.0, patch)


def camera_latents(batch: dict, c: WAMConfig, suffix: str = "") -> torch.Tensor:
    """Latent tokens of every camera ``[B, cameras * patches, token_dim]`` (``suffix=".future"``:
    of the future frames)."""
    missing = [f"{key}{suffix}" for key in c.image_keys if f"{key}{suffix}" not in batch]
    if missing:
        raise ConfigError(f"the wam policy needs {', '.join(missing)} in the batch: train it with "
                          "data.future_offset=K (the camera frame K steps ahead is the world target)")
    return torch.cat([latent_tokens(batch[f"{key}{suffix}"], c.latent_size, c.latent_patch)
                      for key in c.image_keys], dim=1)
