"""Per-patch geometry of the dynamic-resolution vision towers (Qwen3-VL's ``qwen3_vit``, Kimi's
``moonvit``): patch order, resampled learned position embeddings, 2D rotary angles and the frame
layout of the packed patch sequence.

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


def _cubic(distance: torch.Tensor, a: float = -0.75) -> torch.Tensor:
    """Keys' cubic convolution kernel (``a = -0.75``, as torch's bicubic interpolation)."""
    near = ((a + 2) * distance - (a + 3)) * distance * distance + 1
    far = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
    return torch.where(distance <= 1, near, far)


def _axis_taps(length: int, side: int, mode: str = "bilinear") -> tuple[torch.Tensor, torch.Tensor]:
    """Taps into ``side`` table rows for ``length`` target positions: ``(index [length, n],
    weight [length, n])``.

    ``bilinear``: corners aligned, 2 taps (Qwen3-VL). ``bicubic``: pixel centres aligned
    (``F.interpolate(mode="bicubic", align_corners=False)``), 4 taps clamped to the border (MoonViT).
    """
    if mode == "bilinear":
        src = torch.arange(length, dtype=torch.float32) * (side - 1) / max(length - 1, 1)
        low = src.floor()
        frac = src - low
        index = torch.stack([low.long(), (low.long() + 1).clamp(max=side - 1)], dim=-1)
        return index, torch.stack([1 - frac, frac], dim=-1)
    if mode != "bicubic":
        raise ValueError(f"position interpolation {mode!r} is not bilinear or bicubic")
    src = (torch.arange(length, dtype=torch.float32) + 0.5) * side / length - 0.5
    low = src.floor()
    offsets = torch.arange(-1, 3)
    index = (low.long()[:, None] + offsets).clamp(0, side - 1)
    return index, _cubic((src[:, None] - low[:, None] - offsets).abs())


def position_embedding_taps(grid_thw: torch.Tensor, side: int, merge: int,
                            mode: str = "bilinear") -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices and weights that resample a ``side x side`` learned position table to each
    frame's patch grid, in the packed patch order.

    Args:
        grid_thw: ``[n, 3]`` frames, patch rows and patch columns of each image / video.
        side: Side of the square position table.
        merge: Spatial merge size (sets the patch order).
        mode: ``bilinear`` (corners aligned, Qwen3-VL) or ``bicubic`` (pixel centres, MoonViT).

    Returns:
        ``(indices [P, k], weights [P, k])`` for the ``P`` patches (``k`` = 4 bilinear, 16
        bicubic): the embedding of a patch is ``sum_k weights[:, k] * table[indices[:, k]]``.
    """
    indices, weights = [], []
    for t, h, w in grid_thw.tolist():
        row, col = merge_block_coordinates(h, w, merge)
        row_index, row_weight = (x[row] for x in _axis_taps(h, side, mode))
        col_index, col_weight = (x[col] for x in _axis_taps(w, side, mode))
        taps = row_index.shape[1] * col_index.shape[1]
        index = (row_index[:, :, None] * side + col_index[:, None, :]).reshape(-1, taps)
        weight = (row_weight[:, :, None] * col_weight[:, None, :]).reshape(-1, taps)
        indices.append(index.repeat(t, 1))
        weights.append(weight.repeat(t, 1))
    return torch.cat(indices), torch.cat(weights)


def _row_and_column_angles(grid_thw: torch.Tensor, merge: int, head_dim: int, theta: float):
    """Per image: ``(t, row angles, column angles)``, each ``[h * w, head_dim / 4]`` over the same
    frequencies, patches in merge-block order."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head dimension divisible by 4, got {head_dim}")
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)
    for t, h, w in grid_thw.tolist():
        row, col = merge_block_coordinates(h, w, merge)
        yield t, row[:, None].float() * inv_freq, col[:, None].float() * inv_freq


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
    angles = torch.cat([torch.cat([row, col], dim=-1).repeat(t, 1)
                        for t, row, col in _row_and_column_angles(grid_thw, merge, head_dim, theta)])
    return torch.cat([angles, angles], dim=-1)


def interleaved_rotary_angles(grid_thw: torch.Tensor, merge: int, head_dim: int, theta: float) -> torch.Tensor:
    """MoonViT's 2D rotary angles ``[P, head_dim]`` in megatron-core's interleaved-pair layout
    (``rotary_interleaved``: each angle twice in a row): the ``head_dim / 2`` rotated pairs turn
    with the patch column and the patch row alternately, both over the same ``head_dim / 4``
    frequencies (pair ``2j`` with the column at frequency ``j``, pair ``2j + 1`` with the row).

    Args:
        grid_thw: ``[n, 3]`` patch grids.
        merge: Spatial merge size (sets the patch order).
        head_dim: Attention head width (a multiple of 4).
        theta: Frequency base.
    """
    angles = [torch.stack([col, row], dim=-1).reshape(len(row), head_dim // 2).repeat(t, 1)
              for t, row, col in _row_and_column_angles(grid_thw, merge, head_dim, theta)]
    return torch.cat(angles).repeat_interleave(2, dim=-1)


def frame_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches of each frame in packing order (attention stays within a frame)."""
    return [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]


def clip_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches of each image / video clip in packing order (attention spans all its frames)."""
    return [t * h * w for t, h, w in grid_thw.tolist()]
