"""ERNIE-4.5-VL's projector (HF ``VariableResolutionResampler``): spatial then temporal merging.

Each ``m x m`` block of patch features (contiguous in merge-block order) is concatenated and run
through a post-norm MLP (Linear -> GELU -> Linear -> LayerNorm); then the blocks of each pair of
consecutive frames are concatenated (an image, one frame, is paired with itself) and run through
a second such MLP; a Linear to the foundation's width and an RMSNorm finish. The MLPs are tensor
parallel (column- then row-parallel); the last Linear and the norms are replicated.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.ernie4_5_vl.config import ErnieResamplerConfig


class PostNormMLP(MegatronModule):
    """Column-parallel Linear -> GELU -> row-parallel Linear -> LayerNorm.

    Args:
        config: The encoder's ``TransformerConfig`` (TP size, initialisation).
        input_size: Input width.
        output_size: Inner and output width.
        eps: LayerNorm epsilon.
    """

    def __init__(self, config, input_size: int, output_size: int, eps: float):
        super().__init__(config=config)
        self.linear_fc1 = tensor_parallel.ColumnParallelLinear(
            input_size, output_size, config=config, init_method=config.init_method, bias=True, gather_output=False)
        self.linear_fc2 = tensor_parallel.RowParallelLinear(
            output_size, output_size, config=config, init_method=config.output_layer_init_method, bias=True,
            input_is_parallel=True, skip_bias_add=False)
        self.norm = torch.nn.LayerNorm(output_size, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.linear_fc1(x)
        x, _ = self.linear_fc2(torch.nn.functional.gelu(x))
        return self.norm(x)


def frame_pairs(grid_thw: torch.Tensor, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the merged blocks of each token's first and second frame: images pair a frame
    with itself, videos frames ``2k`` and ``2k + 1``.

    Args:
        grid_thw: ``[n, 3]`` patch grids (videos have an even number of frames).
        merge: Spatial merge size.

    Returns:
        ``(first, second)`` LongTensors, one entry per output token.
    """
    first, second, start = [], [], 0
    for t, h, w in grid_thw.tolist():
        blocks = h * w // (merge * merge)
        if t > 1 and t % 2:
            raise ValueError(f"a video of {t} frames: ERNIE-4.5-VL merges pairs of frames, so videos need an "
                             "even number of frames (the data pads the last one).")
        frames = torch.arange(blocks)
        for k in range(0, t, 2):
            first.append(start + k * blocks + frames)
            second.append(start + min(k + 1, t - 1) * blocks + frames)
        start += t * blocks
    return torch.cat(first), torch.cat(second)


class ErnieResampler(MegatronModule):
    """Patch features ``[P, input_size]`` + grids -> tokens ``[P / (m^2 * 2), output_size]`` (an
    image: ``P / m^2`` tokens).

    Args:
        cfg: Projector config.
        config: The encoder's ``TransformerConfig``.
        input_size: Width of the encoder features.
        grid: Unused (dynamic resolution: the grids come with the features).
        output_size: The foundation's hidden size.
    """

    takes_grid = True  # the composer passes grid_thw (temporal pairing)

    def __init__(self, cfg: ErnieResamplerConfig, config, input_size: int, grid, output_size: int):
        super().__init__(config=config)
        if cfg.temporal_merge_size != 2:
            raise ConfigError(f"model.projector.temporal_merge_size = {cfg.temporal_merge_size}: ERNIE-4.5-VL "
                              "pairs frames (2).")
        self.cfg = cfg
        merged = input_size * cfg.spatial_merge_size ** 2
        self.spatial = PostNormMLP(config, merged, merged, cfg.layer_norm_epsilon)
        self.temporal = PostNormMLP(config, 2 * merged, merged, cfg.layer_norm_epsilon)
        self.linear = torch.nn.Linear(merged, output_size)
        self.norm = torch.nn.RMSNorm(output_size, eps=cfg.norm_epsilon)
        with torch.no_grad():
            config.init_method(self.linear.weight)
            self.linear.bias.zero_()

    def forward(self, features: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        m = self.cfg.spatial_merge_size
        x = self.spatial(features.reshape(-1, features.shape[-1] * m * m))
        first, second = (index.to(x.device) for index in frame_pairs(grid_thw, m))
        x = self.temporal(torch.cat([x[first], x[second]], dim=-1))
        return self.norm(self.linear(x))
