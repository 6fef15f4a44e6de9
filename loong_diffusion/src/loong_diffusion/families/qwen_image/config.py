"""Config of the Qwen-Image family: ``QwenImageTransformer2DModel`` arguments, same names (light)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loong_diffusion.config import DiffusionModelConfig


@dataclass
class QwenImageConfig(DiffusionModelConfig):
    """Qwen-Image double-stream transformer. Fields other than ``pretrained`` and the base class's
    are passed to ``QwenImageTransformer2DModel`` unchanged.

    Attributes:
        pretrained: A diffusers directory to load instead of initialising randomly.
        patch_size: Square patch of the latent image (packing ``C x p x p`` per token).
        in_channels: Packed channels per token (latent channels x patch_size^2).
        out_channels: Latent channels out.
        num_layers: Transformer blocks.
        attention_head_dim: Head width.
        num_attention_heads: Heads.
        joint_attention_dim: Width of the text encoder's embeddings (Qwen2.5-VL: 3584).
        guidance_embeds: Distilled-guidance embedding.
        axes_dims_rope: RoPE dims over (frame, height, width); they sum to the head width.
    """

    pretrained: Optional[str] = None
    patch_size: int = 2
    in_channels: int = 64
    out_channels: Optional[int] = 16
    num_layers: int = 60
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 3584
    guidance_embeds: bool = False
    axes_dims_rope: list[int] = field(default_factory=lambda: [16, 56, 56])

    def ulysses_heads(self) -> int:
        """Heads that ``parallel.ulysses_size`` must divide (declares Ulysses support)."""
        return self.num_attention_heads
