"""Projectors: encoder features -> foundation-width tokens (tensor parallel MLP)."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_core.patches import merge_patches
from loong_vlm.config import MLPProjectorConfig

_ACTIVATIONS = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}


class MLPProjector(MegatronModule):
    """LayerNorm -> (merge patches) -> column-parallel linear -> activation -> row-parallel linear.

    Args:
        cfg: Projector config.
        config: A megatron-core ``TransformerConfig`` without sequence parallelism (the
            encoder's): tensor-parallel size and initialisation.
        input_size: Width of the encoder features.
        grid: ``(rows, cols)`` of the encoder's patches per image.
        output_size: The foundation's hidden size.
    """

    def __init__(self, cfg: MLPProjectorConfig, config, input_size: int, grid: tuple[int, int],
                 output_size: int):
        super().__init__(config=config)
        m = cfg.spatial_merge_size
        if m < 1 or grid[0] % m or grid[1] % m:
            raise ConfigError(f"model.projector.spatial_merge_size={m} must divide the encoder's "
                              f"patch grid {grid[0]}x{grid[1]}.")
        hidden = cfg.ffn_hidden_size or output_size
        tp = config.tensor_model_parallel_size
        if hidden % tp:
            raise ConfigError(f"model.projector.ffn_hidden_size ({hidden}) must be divisible by "
                              f"tensor_model_parallel_size ({tp}).")
        self.cfg, self.grid = cfg, grid
        norm_width = input_size * m * m if cfg.norm_after_merge else input_size
        self.norm = torch.nn.LayerNorm(norm_width, eps=cfg.norm_epsilon) if cfg.pre_norm else torch.nn.Identity()
        self.activation = _ACTIVATIONS[cfg.activation]
        self.linear_fc1 = tensor_parallel.ColumnParallelLinear(
            input_size * m * m, hidden, config=config, init_method=config.init_method, bias=True,
            gather_output=False)
        self.linear_fc2 = tensor_parallel.RowParallelLinear(
            hidden, output_size, config=config, init_method=config.output_layer_init_method,
            bias=True, input_is_parallel=True, skip_bias_add=False)

    def tokens_per_image(self) -> int:
        """Output tokens per image."""
        m = self.cfg.spatial_merge_size
        return (self.grid[0] // m) * (self.grid[1] // m)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[N, T, input_size]`` -> ``[N, T / merge^2, output_size]``."""
        if self.cfg.norm_after_merge:
            x = self.norm(merge_patches(features, self.grid, self.cfg.spatial_merge_size))
        else:
            x = merge_patches(self.norm(features), self.grid, self.cfg.spatial_merge_size)
        x, _ = self.linear_fc1(x)
        x, _ = self.linear_fc2(self.activation(x))
        return x
