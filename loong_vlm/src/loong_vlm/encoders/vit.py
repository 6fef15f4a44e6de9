"""A plain ViT on megatron-core layers (tensor parallel through its layer spec)."""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

from loong_vlm.config import ViTConfig
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut ``[N, C, H, W]`` images into row-major patches ``[N, (H/p)*(W/p), C*p*p]``."""
    n, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"image size {h}x{w} is not a multiple of patch_size {p}")
    x = images.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // p) * (w // p), c * p * p)


class ViTEncoder(MegatronModule):
    """Linear patch embedding + learned position embeddings + bidirectional transformer block.

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields (TP size is shared).

    Attributes:
        output_size: Width of the features.
        grid: Patches per column and row of one image.
    """

    def __init__(self, cfg: ViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = encoder_transformer_config(cfg, parallel_kwargs)
        super().__init__(config=config)
        self.cfg = cfg
        self.output_size = cfg.hidden_size
        self.grid = cfg.grid()
        patch_dim = cfg.num_channels * cfg.patch_size ** 2
        self.patch_embed = torch.nn.Linear(patch_dim, cfg.hidden_size)
        self.position_embeddings = torch.nn.Parameter(torch.empty(cfg.num_patches(), cfg.hidden_size))
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
            self.patch_embed.bias.zero_()
            config.init_method(self.position_embeddings)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec(), post_layer_norm=True)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Features ``[N, T, hidden]`` of images ``[N, C, H, W]`` (T = patches per image)."""
        expected = (self.cfg.num_channels, self.cfg.image_size, self.cfg.image_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"images have shape {tuple(images.shape[1:])}, the encoder expects "
                             f"{expected} (model.encoder.num_channels / image_size)")
        x = self.patch_embed(patchify(images, self.cfg.patch_size)) + self.position_embeddings
        x = self.blocks(x.transpose(0, 1).contiguous(), attention_mask=None)  # [T, N, h]
        return x.transpose(0, 1)
