"""Image-patch helpers shared by the VLM projectors (loong_vlm) and the VLA backbones (loong_embodied)."""

from __future__ import annotations

import torch


def merge_patches(features: torch.Tensor, grid: tuple[int, int], size: int) -> torch.Tensor:
    """Concatenate each ``size x size`` block of neighbouring patches into one vector (InternVL's
    and Eagle's ``pixel_shuffle`` with ratio ``1/size``).

    Args:
        features: ``[N, rows*cols, h]`` in row-major patch order.
        grid: ``(rows, cols)`` of the patches.
        size: Block side (1 returns ``features`` unchanged).

    Returns:
        ``[N, (rows/size)*(cols/size), size*size*h]``, blocks in row-major order.
    """
    if size == 1:
        return features
    n, _, h = features.shape
    rows, cols = grid
    x = features.reshape(n, rows // size, size, cols // size, size, h).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (rows // size) * (cols // size), size * size * h)
