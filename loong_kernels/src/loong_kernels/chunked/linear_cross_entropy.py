"""``linear_cross_entropy:chunked``: the token x vocab tiled linear cross entropy in plain torch (any device)."""

from __future__ import annotations

import torch

from loong_kernels import tiled_linear_ce
from loong_kernels.chunked import tiles


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         label_smoothing: float = 0.0, group=None) -> torch.Tensor:
    """Per-token fp32 ``cross_entropy(hidden @ weight.T, labels)`` without the ``[N, V]`` logits.

    Args:
        hidden: ``[N, H]`` final hidden states.
        weight: ``[V_local, H]`` output layer or tied embedding (this rank's vocab shard).
        labels: ``[N]`` global target ids.
        label_smoothing: In ``[0, 1)``.
        group: Tensor-parallel group of the vocab shards, or None.

    Returns:
        fp32 loss ``[N]``; gradients flow to ``hidden`` and ``weight``.
    """
    return tiled_linear_ce.linear_cross_entropy(hidden, weight, labels, label_smoothing, group, tiles)
