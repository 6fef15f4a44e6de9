"""The per-tile cross-entropy math of :mod:`loong_kernels.tiled_linear_ce` in plain torch.

Same contract as :func:`loong_kernels.triton.cross_entropy.tile_stats` / ``tile_grad``.
"""

from __future__ import annotations

import torch


def _targets(labels: torch.Tensor, col_offset: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile column of each row's target (clamped) and whether the target is in this tile."""
    local = labels - col_offset
    inside = (local >= 0) & (local < n_cols)
    return local.clamp(0, n_cols - 1), inside


def tile_stats(z: torch.Tensor, labels: torch.Tensor, col_offset: int, stats: torch.Tensor) -> None:
    """Fold logits ``z [n, v]`` into the running statistics ``stats [4, n]`` in place."""
    z = z.float()
    old_max = stats[0].clone()
    new_max = torch.maximum(old_max, z.max(dim=1).values)
    stats[1].mul_(torch.exp(old_max - new_max)).add_(torch.exp(z - new_max[:, None]).sum(dim=1))
    stats[0].copy_(new_max)
    column, inside = _targets(labels, col_offset, z.shape[1])
    stats[2].add_(torch.where(inside, z.gather(1, column[:, None]).squeeze(1), 0.0))
    stats[3].add_(z.sum(dim=1))


def tile_grad(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, col_offset: int, lse: torch.Tensor,
              grad: torch.Tensor, target_weight: float, uniform: float) -> None:
    """Write ``grad * (softmax - target_weight * onehot - uniform)`` of the tile into ``out``."""
    d = torch.exp(z.float() - lse[:, None])
    if uniform:
        d.sub_(uniform)
    column, inside = _targets(labels, col_offset, z.shape[1])
    d.scatter_add_(1, column[:, None], -target_weight * inside.float()[:, None])
    out.copy_(d.mul_(grad[:, None]))
