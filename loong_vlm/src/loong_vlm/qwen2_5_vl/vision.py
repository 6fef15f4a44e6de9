"""The Qwen2.5-VL vision tower on megatron-core layers: dynamic resolution, 2D RoPE, window attention.

Patches arrive as transformers' ``Qwen2VLImageProcessor`` emits them: every image / video of
the batch concatenated, each walked in ``merge x merge`` blocks (the patches of one block
consecutive). Attention stays inside one frame; most layers further restrict it to windows of
``window_size`` pixels, a few (``fullatt_block_indexes``) see the whole frame. Both are block
masks given as group ids (a ``BlockDiagonalMask``: no ``[n, n]`` mask is built). As transformers
does, the patches of each frame are sorted into their windows once per forward (windows nest in
frames, so frames stay contiguous too): every mask is then a run of contiguous segments, which
attention runs without gathering the tokens of scattered groups at every layer. The output is
put back in the input order.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_core.kernels.segment_mask import BlockDiagonalMask, block_diagonal_mask
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.qwen2_5_vl.config import Qwen25ViTConfig


def patch_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """``[n_patches, 3]`` (frame, row, column) of every patch, frames numbered across the batch.

    Args:
        grid_thw: ``[n, 3]`` patch grids (frames, rows, cols) in batch order.
        merge: Side of the merge block (patch order within a frame is block by block).
    """
    out, frame = [], 0
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h).reshape(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).reshape(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows = rows.permute(0, 2, 1, 3).reshape(-1)  # block row, block col, row in block, col in block
        cols = cols.permute(0, 2, 1, 3).reshape(-1)
        frames = torch.arange(frame, frame + t).repeat_interleave(h * w)
        out.append(torch.stack([frames, rows.repeat(t), cols.repeat(t)], dim=1))
        frame += t
    return torch.cat(out)


def rotary_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """2D rotary angles ``[n, 1, 1, head_dim]`` in megatron-core's rotate-half layout.

    A quarter of the head's frequencies turn with the row, a quarter with the column; the two
    halves of the head share the angles.
    """
    if head_dim % 4:
        raise ConfigError(f"model.encoder: 2D RoPE needs a head dimension divisible by 4, got {head_dim}.")
    quarter = head_dim // 4
    inv_freq = 1.0 / theta ** (torch.arange(0, quarter, dtype=torch.float32) * 2 / (head_dim // 2))
    rows, cols = positions[:, 1].float(), positions[:, 2].float()
    angles = torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=-1)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


def window_ids(positions: torch.Tensor, merge: int, window_tokens: int) -> torch.Tensor:
    """``[n]`` id of the attention window of each patch: windows tile each frame in squares of
    ``window_tokens x window_tokens`` merged tokens from the top-left corner."""
    side = merge * window_tokens
    frame, row, col = positions[:, 0], positions[:, 1] // side, positions[:, 2] // side
    # One integer per (frame, window row, window column), ordered as those triples are (the ids
    # torch.unique(dim=0) gives them, without its row-by-row comparison on a CPU).
    rows, cols = int(row.max()) + 1, int(col.max()) + 1
    return torch.unique((frame * rows + row) * cols + col, return_inverse=True)[1]


def block_mask(ids: torch.Tensor) -> BlockDiagonalMask:
    """The attention mask letting patches with equal ``ids`` ``[n]`` meet, as group ids
    (:class:`~loong_core.kernels.segment_mask.BlockDiagonalMask` ``[1, n]``: no ``[n, n]`` mask)."""
    return block_diagonal_mask(ids[None])


#: Patches encoded together at most (more only when one frame has more): bounds the block masks.
GROUP_PATCHES = 8192


def frame_groups(frames: torch.Tensor, budget: int) -> list[slice]:
    """Consecutive runs of whole frames of at most ``budget`` patches each (a larger frame is a
    run of its own).

    Args:
        frames: ``[n]`` frame number of every patch, non-decreasing (:func:`patch_positions`).
        budget: Patches per run.
    """
    counts = torch.unique_consecutive(frames, return_counts=True)[1].tolist()
    groups, start, size = [], 0, 0
    for count in counts:
        if size and size + count > budget:
            groups.append(slice(start, start + size))
            start, size = start + size, 0
        size += count
    groups.append(slice(start, start + size))
    return groups


class Qwen25VisionEncoder(MegatronModule):
    """Patch embedding (a Conv3d with stride = kernel, i.e. a linear map of each flattened patch)
    + megatron-core transformer layers (RMSNorm, SwiGLU with biases, tensor parallel attention /
    MLP from the local spec) with 2D RoPE and window / full attention.

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields.

    Attributes:
        output_size: Width of the features (before the merger).
        grid: None: the patch grid comes with each batch (``image_grid_thw``).
    """

    dynamic_resolution = True

    def __init__(self, cfg: Qwen25ViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = encoder_transformer_config(cfg, parallel_kwargs, normalization="RMSNorm",
                                            gated_linear_unit=True, activation_func=torch.nn.functional.silu)
        super().__init__(config=config)
        merge_side = cfg.spatial_merge_size * cfg.patch_size
        if cfg.window_size < merge_side or cfg.window_size % merge_side:
            raise ConfigError(f"model.encoder.window_size ({cfg.window_size}) must be a multiple of "
                              f"spatial_merge_size * patch_size ({merge_side}).")
        bad = [i for i in cfg.fullatt_block_indexes if not 0 <= i < cfg.num_layers]
        if bad:
            raise ConfigError(f"model.encoder.fullatt_block_indexes {bad} are not layers of a "
                              f"{cfg.num_layers}-layer encoder.")
        self.cfg, self.output_size, self.grid = cfg, cfg.hidden_size, None
        self.window_tokens = cfg.window_size // merge_side
        self.patch_embed = torch.nn.Linear(cfg.patch_dim(), cfg.hidden_size, bias=False)
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
        self.blocks = TransformerBlock(config=config, spec=bidirectional_layer_spec("RMSNorm"),
                                       post_layer_norm=False)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Features ``[n_patches, hidden]`` (input patch order) of patches ``[n_patches, patch_dim]``."""
        c = self.cfg
        if pixel_values.shape[-1] != c.patch_dim():
            raise ValueError(f"pixel_values have {pixel_values.shape[-1]} values per patch, the encoder "
                             f"expects {c.patch_dim()} (num_channels * temporal_patch_size * patch_size^2).")
        positions = patch_positions(grid_thw.cpu(), c.spatial_merge_size).to(pixel_values.device)
        if positions.shape[0] != pixel_values.shape[0]:
            raise ValueError(f"grid_thw describes {positions.shape[0]} patches but pixel_values has "
                             f"{pixel_values.shape[0]}.")
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))[:, None, :]  # [n, 1, h]
        # Attention never crosses a frame: whole frames are encoded in groups, so the masks stay
        # [group, group] however long the video (the result equals one pass over all patches).
        pieces = []
        for group in frame_groups(positions[:, 0], GROUP_PATCHES):
            pieces.append(self._encode(x[group], positions[group]))
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _encode(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Features ``[n, hidden]`` of embedded patches ``[n, 1, hidden]`` of whole frames."""
        c = self.cfg
        windows = window_ids(positions, c.spatial_merge_size, self.window_tokens)
        order = None
        if windows.numel() > 1 and bool((windows[1:] < windows[:-1]).any()):   # sorted into windows once
            order = torch.argsort(windows, stable=True)
            x, positions, windows = x.index_select(0, order), positions.index_select(0, order), windows[order]
        rotary = rotary_angles(positions, c.hidden_size // c.num_attention_heads, c.rope_theta)
        full_mask = block_mask(positions[:, 0])
        window_mask = block_mask(windows)
        for index, layer in enumerate(self.blocks.layers):
            mask = full_mask if index in c.fullatt_block_indexes else window_mask
            x, _ = layer(x, attention_mask=mask, rotary_pos_emb=rotary)
        return x[:, 0] if order is None else x[:, 0].index_select(0, torch.argsort(order))
