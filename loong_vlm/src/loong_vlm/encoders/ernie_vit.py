"""ERNIE-4.5-VL's vision tower on megatron-core layers (tensor parallel through the local spec).

A Qwen2-VL-style ViT: bias-free linear patch embedding (one frame per patch), LayerNorm blocks
with a ``quick_gelu`` MLP and 2D RoPE, attention within each frame, a final LayerNorm. The patch
order, the rotary angles and the per-frame attention batch are Qwen3-VL's
(:mod:`loong_vlm.encoders.patch_geometry`, :class:`~loong_vlm.encoders.qwen3_vit.FrameBatch`).
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_vlm.encoders import patch_geometry as geometry
from loong_vlm.encoders.qwen3_vit import FrameBatch
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.ernie4_5_vl.config import ErnieViTConfig


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(1.702 x)`` (transformers' ``quick_gelu``)."""
    return x * torch.sigmoid(1.702 * x)


_ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu": torch.nn.functional.gelu}


class ErnieViTEncoder(MegatronModule):
    """Packed patches + grids -> one feature per patch (merge-block order), final LayerNorm applied.

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields.

    Attributes:
        output_size: Width of the features.
        grid: Patch grid of an ``image_size`` square image (fixed-resolution bookkeeping only).
    """

    dynamic_resolution = True  # pixel_values + grid_thw (docs/vlm_inputs.md)

    def __init__(self, cfg: ErnieViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = encoder_transformer_config(cfg, parallel_kwargs, activation_func=_ACTIVATIONS[cfg.hidden_act])
        super().__init__(config=config)
        self.cfg, self.output_size = cfg, cfg.hidden_size
        self.grid = (cfg.image_size // cfg.patch_size,) * 2
        self.patch_embed = torch.nn.Linear(cfg.num_channels * cfg.patch_size ** 2, cfg.hidden_size, bias=False)
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec(), post_layer_norm=True)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Features ``[P, hidden]`` of ``pixel_values`` ``[P, C * p^2]`` with grids ``[n, 3]``."""
        c = self.cfg
        expected = c.num_channels * c.patch_size ** 2
        if pixel_values.shape[-1] != expected:
            raise ValueError(f"pixel_values rows have {pixel_values.shape[-1]} values, the encoder expects "
                             f"num_channels * patch_size^2 = {expected} (one frame per patch).")
        if int(grid_thw.prod(-1).sum()) != pixel_values.shape[0]:
            raise ValueError(f"grid_thw describes {int(grid_thw.prod(-1).sum())} patches but pixel_values has "
                             f"{pixel_values.shape[0]} rows.")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))
        frames = FrameBatch(geometry.frame_lengths(grid_thw), x.device)
        head_dim = c.hidden_size // c.num_attention_heads
        rotary = geometry.rotary_angles(grid_thw, c.spatial_merge_size, head_dim, c.rope_theta).to(x.device)
        rotary = frames.pad(rotary)[:, :, None, :]  # [max_len, frames, 1, head_dim]
        hidden = frames.pad(x)
        recompute = self.config.recompute_granularity == "full" and self.training
        for layer in self.blocks.layers:
            def run(x, layer=layer):
                return layer(hidden_states=x, attention_mask=frames.mask, rotary_pos_emb=rotary)[0]

            hidden = tensor_parallel.checkpoint(run, False, hidden) if recompute else run(hidden)
        return self.blocks.final_layernorm(frames.unpad(hidden))
