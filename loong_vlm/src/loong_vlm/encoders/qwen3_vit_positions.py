"""Per-patch geometry of the Qwen3-VL vision tower: patch order, resampled learned position
embeddings, 2D rotary angles and the frame layout of the packed patch sequence.

Patches arrive as transformers' Qwen2-VL image processor emits them: frame by frame, and within a
frame in *merge-block order* (each ``m x m`` block of neighbouring patches is contiguous, blocks in
row-major order, patches row-major inside a block).
"""

from __future__ import annotations

import torch


def merge_block_coordinates(rows: int, cols: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of a ``rows x cols`` frame, in merge-block order.

    Args:
        rows: Patch rows (a multiple of ``merge``).
        cols: Patch columns (a multiple of ``merge``).
        merge: Side of a merge block.

    Returns:
        ``(row, col)`` LongTensors of length ``rows * cols``.
    """
    row = torch.arange(rows).view(rows // merge, merge, 1, 1).expand(-1, -1, cols // merge, merge)
    col = torch.arange(cols).view(1, 1, cols // merge, merge).expand(rows // merge, merge, -1, -1)
    # [block_row, in_row, block_col, in_col] -> [block_row, block_col, in_row, in_col]
    return row.permute(0, 2, 1, 3).reshape(-1), col.permute(0, 2, 1, 3).reshape(-1)


def _axis_taps(length: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (corner-aligned) taps into ``side`` table rows for ``length`` target positions:
    ``(index [length, 2], weight [length, 2])``."""
    src = torch.arange(length, dtype=torch.float32) * (side - 1) / max(length - 1, 1)
    low = src.floor()
    frac = src - low
    index = torch.stack([low.long(), (low.long() + 1).clamp(max=side - 1)], dim=-1)
    return index, torch.stack([1 - frac, frac], dim=-1)


def position_embedding_taps(grid_thw: torch.Tensor, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices and weights that resample a ``side x side`` learned position table to each
    frame's patch grid (bilinear, corners aligned), in the packed patch order.

    Args:
        grid_thw: ``[n, 3]`` frames, patch rows and patch columns of each image / video.
        side: Side of the square position table.
        merge: Spatial merge size (sets the patch order).

    Returns:
        ``(indices [P, 4], weights [P, 4])`` for the ``P`` patches: the embedding of a patch is
        ``sum_k weights[:, k] * table[indices[:, k]]``.
    """
    indices, weights = [], []
    for t, h, w in grid_thw.tolist():
        row, col = merge_block_coordinates(h, w, merge)
        row_index, row_weight = (x[row] for x in _axis_taps(h, side))
        col_index, col_weight = (x[col] for x in _axis_taps(w, side))
        index = (row_index[:, :, None] * side + col_index[:, None, :]).reshape(-1, 4)
        weight = (row_weight[:, :, None] * col_weight[:, None, :]).reshape(-1, 4)
        indices.append(index.repeat(t, 1))
        weights.append(weight.repeat(t, 1))
    return torch.cat(indices), torch.cat(weights)


def rotary_angles(grid_thw: torch.Tensor, merge: int, head_dim: int, theta: float) -> torch.Tensor:
    """2D rotary angles ``[P, head_dim]`` of the packed patches (rotate-half layout).

    A quarter of each head's frequencies turn with the patch row, a quarter with its column;
    the half is repeated for megatron-core's (and transformers') rotate-half convention.

    Args:
        grid_thw: ``[n, 3]`` patch grids.
        merge: Spatial merge size (sets the patch order).
        head_dim: Attention head width (a multiple of 4).
        theta: Frequency base.
    """
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head dimension divisible by 4, got {head_dim}")
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
    angles = []
    for t, h, w in grid_thw.tolist():
        row, col = merge_block_coordinates(h, w, merge)
        frame = torch.cat([row[:, None].float() * inv_freq, col[:, None].float() * inv_freq], dim=-1)
        angles.append(frame.repeat(t, 1))
    angles = torch.cat(angles)
    return torch.cat([angles, angles], dim=-1)


def frame_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches of each frame in packing order (attention stays within a frame)."""
    return [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]
