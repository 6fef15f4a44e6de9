"""Qwen2.5-VL's patch merger: RMSNorm, 2x2 blocks of consecutive patches, tensor-parallel MLP."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.qwen2_5_vl.config import Qwen25MergerConfig


class Qwen25PatchMerger(MegatronModule):
    """RMSNorm (or LayerNorm) over each patch -> concatenate each ``merge^2`` consecutive patches (one merge
    block, as the encoder keeps them) -> column-parallel Linear -> GELU -> row-parallel Linear.

    Args:
        cfg: Merger config.
        config: The encoder's ``TransformerConfig`` (tensor-parallel size, initialisation).
        input_size: Width of the encoder features.
        grid: Unused (dynamic resolution: one token per block whatever the image size).
        output_size: The foundation's hidden size.
    """

    def __init__(self, cfg: Qwen25MergerConfig, config, input_size: int, grid, output_size: int):
        super().__init__(config=config)
        self.cfg = cfg
        self.block = cfg.spatial_merge_size ** 2
        width = input_size * self.block
        tp = config.tensor_model_parallel_size
        if width % tp:
            raise ConfigError(f"the merger width {width} (encoder hidden_size x spatial_merge_size^2) "
                              f"must be divisible by tensor_model_parallel_size ({tp}).")
        norm = torch.nn.LayerNorm if cfg.normalization == "LayerNorm" else torch.nn.RMSNorm
        self.norm = norm(input_size, eps=cfg.norm_epsilon)
        self.linear_fc1 = tensor_parallel.ColumnParallelLinear(
            width, width, config=config, init_method=config.init_method, bias=True, gather_output=False)
        self.linear_fc2 = tensor_parallel.RowParallelLinear(
            width, output_size, config=config, init_method=config.output_layer_init_method, bias=True,
            input_is_parallel=True, skip_bias_add=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[n_patches, input_size]`` -> ``[n_patches / merge^2, output_size]``."""
        if features.shape[0] % self.block:
            raise ValueError(f"{features.shape[0]} patches do not form whole {self.block}-patch merge "
                             f"blocks (model.projector.spatial_merge_size={self.cfg.spatial_merge_size}).")
        x = self.norm(features).reshape(-1, 1, features.shape[-1] * self.block)  # [tokens, 1, width]
        x, _ = self.linear_fc1(x)
        x, _ = self.linear_fc2(torch.nn.functional.gelu(x))
        return x[:, 0]
