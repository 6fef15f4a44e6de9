"""A Qwen2.5-VL-style ViT: 2D rotary position embeddings, RMSNorm, SwiGLU (megatron-core layers)."""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

from loong_vlm.config import Rope2DViTConfig
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.encoders.vit import patchify


def rope_2d(grid: tuple[int, int], head_dim: int, theta: float) -> torch.Tensor:
    """Rotary angles of a patch grid in megatron-core's layout ``[rows*cols, 1, 1, head_dim]``.

    The first half of a head's rotated pairs turn with the patch row, the second half with its
    column (row-major patch order); megatron-core's rotate-half convention repeats the angles.

    Args:
        grid: ``(rows, cols)`` of the patches.
        head_dim: Width of one attention head (a multiple of 4).
        theta: Frequency base.
    """
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head dimension divisible by 4, got {head_dim}")
    quarter = head_dim // 4
    inv_freq = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    rows, cols = grid
    r = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)
    c = torch.arange(cols, dtype=torch.float32).repeat(rows)
    angles = torch.cat([r[:, None] * inv_freq, c[:, None] * inv_freq], dim=-1)  # [T, head_dim/2]
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


class Rope2DViTEncoder(MegatronModule):
    """Linear patch embedding + bidirectional RMSNorm/SwiGLU transformer with 2D RoPE.

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields (TP size is shared).

    Attributes:
        output_size: Width of the features.
        grid: Patches per column and row of one image.
    """

    def __init__(self, cfg: Rope2DViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = encoder_transformer_config(cfg, parallel_kwargs, normalization="RMSNorm",
                                            gated_linear_unit=True, activation_func=torch.nn.functional.silu)
        super().__init__(config=config)
        self.cfg, self.output_size, self.grid = cfg, cfg.hidden_size, cfg.grid()
        self.patch_embed = torch.nn.Linear(cfg.num_channels * cfg.patch_size ** 2, cfg.hidden_size)
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
            self.patch_embed.bias.zero_()
        self.register_buffer("rotary", rope_2d(self.grid, cfg.hidden_size // cfg.num_attention_heads,
                                               cfg.rope_theta), persistent=False)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec("RMSNorm"),
                                       post_layer_norm=True)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Features ``[N, T, hidden]`` of images ``[N, C, H, W]``."""
        x = self.patch_embed(patchify(images, self.cfg.patch_size)).transpose(0, 1).contiguous()
        x = self.blocks(x, attention_mask=None, rotary_pos_emb=self.rotary)
        return x.transpose(0, 1)
