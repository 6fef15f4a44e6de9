"""MoonViT, the vision tower of Kimi-VL / Kimi-K2.5, on megatron-core layers (tensor parallel
through the local spec).

Conv2d patch embedding + a learned position table resampled bicubically to each image's grid + a
sinusoid per frame of a video clip, LayerNorm / GELU blocks with interleaved-pair 2D RoPE and
attention over each clip, a final LayerNorm, then the frames of each clip averaged patch by patch.
Patches travel in merge-block order (:mod:`loong_vlm.encoders.patch_geometry`), so the projector
(``qwen2_5_merger`` with a LayerNorm) merges consecutive rows.
"""

from __future__ import annotations

import functools

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.encoders import patch_geometry as geometry
from loong_vlm.encoders.qwen3_vit import FrameBatch
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.kimi_k25.config import MoonViTConfig

_ACTIVATIONS = {"gelu_pytorch_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
                "gelu": torch.nn.functional.gelu}


def frame_sinusoids(frames: int, width: int) -> torch.Tensor:
    """``[frames + 1, width]`` additive frame embeddings: row 0 zeros (a single image gets none),
    row ``f + 1`` the sine / cosine halves of frame ``f`` at frequencies ``10000^(-2i/width)``."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, width, 2, dtype=torch.float32) / width)
    angles = torch.outer(torch.arange(frames, dtype=torch.float32), inv_freq)
    return torch.cat([torch.zeros(1, width), torch.cat([angles.sin(), angles.cos()], dim=1)])


def frame_rows(grid_thw: torch.Tensor) -> torch.Tensor:
    """Row of :func:`frame_sinusoids` for each packed patch: 0 for images, ``f + 1`` for the
    patches of frame ``f`` of a clip of several frames."""
    rows = [torch.arange(t).add(int(t > 1)).repeat_interleave(h * w) for t, h, w in grid_thw.tolist()]
    return torch.cat(rows)


def clip_grids(grid_thw: torch.Tensor, clip_frames: int) -> torch.Tensor:
    """``grid_thw`` with each video of more than ``clip_frames`` frames cut into clips of that many
    frames (the last may be shorter), as transformers' Kimi-K2.5 video processor cuts them."""
    rows = []
    for t, h, w in grid_thw.tolist():
        rows += [[min(clip_frames, t - start), h, w] for start in range(0, t, clip_frames)]
    return torch.tensor(rows, dtype=grid_thw.dtype, device=grid_thw.device).reshape(-1, 3)


def mean_over_frames(features: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """``[P, h]`` packed patches -> ``[sum(h*w), h]``: each clip's frames averaged per patch."""
    out = [clip.reshape(t, h * w, -1).float().mean(0).to(features.dtype)
           for clip, (t, h, w) in zip(features.split(geometry.clip_lengths(grid_thw)), grid_thw.tolist())]
    return torch.cat(out)


class MoonViTEncoder(MegatronModule):
    """MoonViT: packed patches + grids -> one feature per patch of a frame (merge-block order).

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields (TP size is shared).

    Attributes:
        output_size: Width of the features (``hidden_size``; the projector merges and projects).
        grid: Patch grid of an ``image_size`` square image (fixed-resolution bookkeeping only).
    """

    dynamic_resolution = True  # takes pixel_values + grid_thw (docs/vlm_inputs.md)

    def __init__(self, cfg: MoonViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        if cfg.hidden_act not in _ACTIVATIONS:
            raise ConfigError(f"model.encoder.hidden_act={cfg.hidden_act!r} is not supported; "
                              f"choices: {', '.join(_ACTIVATIONS)}.")
        if cfg.recompute_granularity == "full" and (cfg.recompute_num_layers or 1) != 1:
            raise ConfigError("moonvit recomputes each block on its own: set model.encoder.recompute_num_layers=1 "
                              "with recompute_granularity=full.")
        if (cfg.hidden_size // cfg.num_attention_heads) % 4:
            raise ConfigError(f"model.encoder: MoonViT's 2D RoPE needs a head width divisible by 4, got "
                              f"hidden_size / num_attention_heads = {cfg.hidden_size / cfg.num_attention_heads}.")
        config = encoder_transformer_config(cfg, parallel_kwargs, activation_func=_ACTIVATIONS[cfg.hidden_act],
                                            rotary_interleaved=True)
        super().__init__(config=config)
        self.cfg = cfg
        self.output_size = cfg.hidden_size
        self.grid = (cfg.image_size // cfg.patch_size,) * 2
        self.patch_embed = torch.nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, stride=cfg.patch_size)
        self.pos_embed = torch.nn.Parameter(torch.empty(cfg.position_grid, cfg.position_grid, cfg.hidden_size))
        self.register_buffer("frame_embed", frame_sinusoids(cfg.num_frame_embeddings, cfg.hidden_size),
                             persistent=False)
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
            self.patch_embed.bias.zero_()
            config.init_method(self.pos_embed)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec(), post_layer_norm=False)
        self.final_layernorm = torch.nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)

    def embed(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Patch embeddings plus resampled positions and frame sinusoids, ``[P, hidden]``."""
        c = self.cfg
        expected = c.num_channels * c.patch_size ** 2
        if pixel_values[0].numel() != expected:
            raise ValueError(f"pixel_values rows have {pixel_values[0].numel()} values, MoonViT expects "
                             f"num_channels * patch_size^2 = {expected} (one frame per patch).")
        x = pixel_values.reshape(-1, c.num_channels, c.patch_size, c.patch_size)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype)).reshape(-1, c.hidden_size)
        index, weight = geometry.position_embedding_taps(grid_thw, c.position_grid, c.spatial_merge_size, "bicubic")
        table = self.pos_embed.reshape(-1, c.hidden_size)
        pos = (table[index.to(x.device)] * weight.to(x)[:, :, None]).sum(1)
        return x + pos + self.frame_embed[frame_rows(grid_thw).to(x.device)].to(x)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Features of a micro batch's images / video clips.

        Args:
            pixel_values: ``[P, C * patch^2]`` (or ``[P, C, patch, patch]``) patches, packed.
            grid_thw: ``[n, 3]`` patch grid of each image / video; a video of more frames than
                ``num_frame_embeddings`` is cut into clips of that many.

        Returns:
            ``[tokens * merge^2, hidden]``: one feature per patch of a frame, each clip's frames averaged.
        """
        c = self.cfg
        if int(grid_thw.prod(-1).sum()) != pixel_values.shape[0]:
            raise ValueError(f"grid_thw describes {int(grid_thw.prod(-1).sum())} patches but "
                             f"pixel_values has {pixel_values.shape[0]} rows.")
        grid_thw = clip_grids(grid_thw, c.num_frame_embeddings)
        x = self.embed(pixel_values, grid_thw)
        clips = FrameBatch(geometry.clip_lengths(grid_thw), x.device)
        head_dim = c.hidden_size // c.num_attention_heads
        rotary = geometry.interleaved_rotary_angles(grid_thw, c.spatial_merge_size, head_dim, c.rope_theta)
        rotary = clips.pad(rotary.to(x.device))[:, :, None, :]  # [max_len, clips, 1, head_dim]
        hidden = clips.pad(x)
        recompute = self.config.recompute_granularity == "full" and self.training
        for layer in self.blocks.layers:
            def run(x, layer=layer):
                return layer(hidden_states=x, attention_mask=clips.mask, rotary_pos_emb=rotary)[0]

            hidden = tensor_parallel.checkpoint(run, False, hidden) if recompute else run(hidden)
        return mean_over_frames(self.final_layernorm(clips.unpad(hidden)), grid_thw)
