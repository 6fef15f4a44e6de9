"""Config of the small DiT (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_diffusion.config import DiffusionModelConfig


@dataclass
class DiTConfig(DiffusionModelConfig):
    """Class-conditional DiT on images ``[in_channels, image_size, image_size]``.

    Attributes:
        image_size: Height and width of the input.
        in_channels: Channels of the input (1 for grey digits, the VAE's for latents).
        patch_size: Square patch edge; tokens are ``(image_size / patch_size)^2``.
        hidden_size: Width.
        num_layers: DiT blocks.
        num_attention_heads: Attention heads.
        mlp_ratio: MLP width / hidden size.
        num_classes: Classes; label ``num_classes`` is the null class (guidance).
        frequency_dim: Sinusoidal timestep embedding width.
    """

    image_size: int = 8
    in_channels: int = 1
    patch_size: int = 2
    hidden_size: int = 128
    num_layers: int = 4
    num_attention_heads: int = 4
    mlp_ratio: float = 4.0
    num_classes: int = 10
    frequency_dim: int = 128

    def ulysses_heads(self) -> int:
        """Heads that ``parallel.ulysses_size`` must divide (declares Ulysses support)."""
        return self.num_attention_heads
