"""The Qwen3-VL vision tower on megatron-core layers (tensor parallel through the local spec).

Patch embedding (Conv3d with bias) + learned position embeddings resampled to each image's grid,
LayerNorm / GELU transformer blocks with 2D RoPE and attention within each frame, a patch merger
to the foundation's width, and one deepstack merger per layer listed in
``deepstack_visual_indexes`` (features after that layer).
"""

from __future__ import annotations

import functools

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.encoders import patch_geometry as geometry
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.qwen3_vl.config import Qwen3ViTConfig

_ACTIVATIONS = {"gelu_pytorch_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
                "gelu": torch.nn.functional.gelu}


class Qwen3PatchMerger(MegatronModule):
    """LayerNorm -> concatenate each ``m x m`` block of consecutive patches -> column-parallel
    linear -> GELU -> row-parallel linear.

    Args:
        config: The encoder's ``TransformerConfig``.
        hidden_size: Width of the encoder features.
        merge: Spatial merge size.
        output_size: Width of the merged tokens.
        norm_after_merge: Normalise the concatenated block (deepstack mergers) instead of each
            patch (the final merger).
        eps: LayerNorm epsilon.
    """

    def __init__(self, config, hidden_size: int, merge: int, output_size: int, norm_after_merge: bool,
                 eps: float = 1e-6):
        super().__init__(config=config)
        self.merged_size = hidden_size * merge * merge
        self.norm_after_merge = norm_after_merge
        self.norm = torch.nn.LayerNorm(self.merged_size if norm_after_merge else hidden_size, eps=eps)
        self.linear_fc1 = tensor_parallel.ColumnParallelLinear(
            self.merged_size, self.merged_size, config=config, init_method=config.init_method, bias=True,
            gather_output=False)
        self.linear_fc2 = tensor_parallel.RowParallelLinear(
            self.merged_size, output_size, config=config, init_method=config.output_layer_init_method,
            bias=True, input_is_parallel=True, skip_bias_add=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[P, hidden]`` patches in merge-block order -> ``[P / m^2, output_size]``."""
        if self.norm_after_merge:
            x = self.norm(features.reshape(-1, self.merged_size))
        else:
            x = self.norm(features).reshape(-1, self.merged_size)
        x, _ = self.linear_fc1(x)
        x, _ = self.linear_fc2(torch.nn.functional.gelu(x))
        return x


class _MergerList(torch.nn.ModuleList):
    """A ModuleList whose distributed-checkpoint state keeps each merger's TP sharding (a plain
    ModuleList would be saved as replicated tensors of the local shard's shape)."""

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        out = {}
        for index, merger in enumerate(self):
            out.update(merger.sharded_state_dict(f"{prefix}{index}.", sharded_offsets, metadata))
        return out


class FrameBatch:
    """Scatters the packed patch sequence into a padded ``[max_len, segments, ...]`` batch (one
    attention segment per batch column: a frame for Qwen3-VL, a whole clip for MoonViT, so
    attention stays within it) and gathers it back.

    Args:
        lengths: Patches of each segment, in packing order.
        device: Where the index tensors live.
    """

    def __init__(self, lengths: list[int], device: torch.device):
        self.frames, self.max_len = len(lengths), max(lengths)
        lengths_t = torch.tensor(lengths, device=device)
        frame = torch.repeat_interleave(torch.arange(self.frames, device=device), lengths_t)
        starts = torch.cumsum(lengths_t, 0) - lengths_t
        position = torch.arange(int(lengths_t.sum()), device=device) - starts[frame]
        self.flat_index = position * self.frames + frame
        self.mask = None
        if min(lengths) != self.max_len:  # [frames, 1, 1, max_len], True = padding key
            keys = torch.arange(self.max_len, device=device)
            self.mask = (keys[None, :] >= lengths_t[:, None])[:, None, None, :]

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """``[P, ...]`` -> ``[max_len, frames, ...]`` (zeros at padding)."""
        out = packed.new_zeros(self.max_len * self.frames, *packed.shape[1:])
        out = out.index_copy(0, self.flat_index, packed)
        return out.reshape(self.max_len, self.frames, *packed.shape[1:])

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """``[max_len, frames, ...]`` -> ``[P, ...]``."""
        return padded.reshape(self.max_len * self.frames, *padded.shape[2:])[self.flat_index]


class Qwen3ViTEncoder(MegatronModule):
    """Qwen3-VL's vision tower: packed patches + grids -> merged tokens and deepstack features.

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields (TP size is shared).

    Attributes:
        output_size: Width of the merged tokens (``out_hidden_size``).
        grid: Patch grid of an ``image_size`` square image (fixed-resolution bookkeeping only).
    """

    dynamic_resolution = True  # takes pixel_values + grid_thw (docs/vlm_inputs.md)

    def __init__(self, cfg: Qwen3ViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        if cfg.hidden_act not in _ACTIVATIONS:
            raise ConfigError(f"model.encoder.hidden_act={cfg.hidden_act!r} is not supported; "
                              f"choices: {', '.join(_ACTIVATIONS)}.")
        bad = [i for i in cfg.deepstack_visual_indexes if not 0 <= i < cfg.num_layers]
        if bad:
            raise ConfigError(f"model.encoder.deepstack_visual_indexes {bad} are not layers of a "
                              f"{cfg.num_layers}-layer encoder (0..{cfg.num_layers - 1}).")
        side = int(round(cfg.num_position_embeddings ** 0.5))
        if side * side != cfg.num_position_embeddings:
            raise ConfigError(f"model.encoder.num_position_embeddings={cfg.num_position_embeddings} "
                              f"must be a square number (a side x side grid).")
        if cfg.recompute_granularity == "full" and (cfg.recompute_num_layers or 1) != 1:
            raise ConfigError("qwen3_vit recomputes each block on its own (deepstack features are taken "
                              "between blocks): set model.encoder.recompute_num_layers=1 with "
                              "recompute_granularity=full.")
        config = encoder_transformer_config(cfg, parallel_kwargs, activation_func=_ACTIVATIONS[cfg.hidden_act])
        super().__init__(config=config)
        self.cfg, self.side = cfg, side
        self.output_size = cfg.out_hidden_size
        self.grid = (cfg.image_size // cfg.patch_size,) * 2
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed = torch.nn.Conv3d(cfg.num_channels, cfg.hidden_size, kernel, stride=kernel, bias=True)
        self.pos_embed = torch.nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
            self.patch_embed.bias.zero_()
            config.init_method(self.pos_embed.weight)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec(), post_layer_norm=False)
        merger = functools.partial(Qwen3PatchMerger, config, cfg.hidden_size, cfg.spatial_merge_size,
                                   cfg.out_hidden_size, eps=cfg.norm_epsilon)
        self.merger = merger(norm_after_merge=False)
        self.deepstack_mergers = _MergerList(merger(norm_after_merge=True) for _ in cfg.deepstack_visual_indexes)

    def embed(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Patch embeddings plus resampled position embeddings, ``[P, hidden]``."""
        c = self.cfg
        expected = c.num_channels * c.temporal_patch_size * c.patch_size ** 2
        if pixel_values.shape[-1] != expected:
            raise ValueError(f"pixel_values rows have {pixel_values.shape[-1]} values, the encoder "
                             f"expects num_channels * temporal_patch_size * patch_size^2 = {expected}.")
        x = pixel_values.reshape(-1, c.num_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype)).reshape(-1, c.hidden_size)
        index, weight = geometry.position_embedding_taps(grid_thw, self.side, c.spatial_merge_size)
        pos = (self.pos_embed(index.to(x.device)) * weight.to(x)[:, :, None]).sum(1)
        return x + pos

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Merged tokens and deepstack features of a micro batch's images / videos.

        Args:
            pixel_values: ``[P, C * temporal_patch * patch^2]`` patches of every image, packed.
            grid_thw: ``[n, 3]`` patch grid of each image.

        Returns:
            ``(tokens [P / m^2, out_hidden_size], [deepstack feature of the same shape per index])``.
        """
        c = self.cfg
        if int(grid_thw.prod(-1).sum()) != pixel_values.shape[0]:
            raise ValueError(f"grid_thw describes {int(grid_thw.prod(-1).sum())} patches but "
                             f"pixel_values has {pixel_values.shape[0]} rows.")
        x = self.embed(pixel_values, grid_thw)
        frames = FrameBatch(geometry.frame_lengths(grid_thw), x.device)
        head_dim = c.hidden_size // c.num_attention_heads
        rotary = geometry.rotary_angles(grid_thw, c.spatial_merge_size, head_dim, c.rope_theta).to(x.device)
        rotary = frames.pad(rotary)[:, :, None, :]  # [max_len, frames, 1, head_dim]
        hidden = frames.pad(x)
        deepstack = []
        recompute = self.config.recompute_granularity == "full" and self.training
        for index, layer in enumerate(self.blocks.layers):
            def run(x, layer=layer):
                return layer(hidden_states=x, attention_mask=frames.mask, rotary_pos_emb=rotary)[0]

            hidden = tensor_parallel.checkpoint(run, False, hidden) if recompute else run(hidden)
            if index in c.deepstack_visual_indexes:
                merger = self.deepstack_mergers[c.deepstack_visual_indexes.index(index)]
                deepstack.append(merger(frames.unpad(hidden)))
        return self.merger(frames.unpad(hidden)), deepstack
