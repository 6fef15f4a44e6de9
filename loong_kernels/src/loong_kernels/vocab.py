"""Vocab-parallel cross entropy from per-row statistics, shared by every cross-entropy kernel.

A kernel reduces its vocab shard (or a tile of it) to four fp32 numbers per row: the running max
``m``, the sum of ``exp(z - m)``, the target logit (0 where the target is in another shard) and the
sum of the logits (for label smoothing). :func:`finish` combines them across the tensor-parallel
group with two all-reduces and returns megatron-core's ``vocab_parallel_cross_entropy`` loss:
``lse - (1 - a) * z_target - a * mean(z_local)`` with ``a = smoothing * V_local / (V_local - 1)``
(as megatron-core, the smoothing term averages the rank's own shard).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_start(v_local: int, group) -> int:
    """First global vocab id of this rank's contiguous shard of ``v_local`` ids."""
    if group is None or dist.get_world_size(group) == 1:
        return 0
    return dist.get_rank(group) * v_local


def smoothing_coefficient(label_smoothing: float, v_local: int) -> float:
    """megatron-core's ``smoothing`` factor ``a`` (0 without label smoothing)."""
    if label_smoothing <= 0.0:
        return 0.0
    if not 0.0 < label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    return label_smoothing * v_local / (v_local - 1)


def new_stats(rows: int, device: torch.device) -> torch.Tensor:
    """Empty running statistics ``[4, rows]`` fp32: max (-inf), sum-exp, target logit, logit sum."""
    stats = torch.zeros(4, rows, device=device, dtype=torch.float32)
    stats[0] = float("-inf")
    return stats


def finish(stats: torch.Tensor, v_local: int, label_smoothing: float, group) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss and global log-sum-exp from this shard's statistics.

    Args:
        stats: ``[4, rows]`` from the kernels (modified in place).
        v_local: Vocab size of this rank's shard.
        label_smoothing: megatron-core's label smoothing.
        group: Tensor-parallel process group, or None for the whole vocab on one rank.

    Returns:
        ``(loss, lse)``, both fp32 ``[rows]``.
    """
    local_max, sum_exp, target, logit_sum = stats
    if group is not None and dist.get_world_size(group) > 1:
        global_max = local_max.clone()
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        sum_exp.mul_(torch.exp(local_max - global_max))
        dist.all_reduce(stats[1:3], op=dist.ReduceOp.SUM, group=group)
        local_max = global_max
    lse = local_max + torch.log(sum_exp)
    a = smoothing_coefficient(label_smoothing, v_local)
    if a == 0.0:
        return lse - target, lse
    return lse - (1.0 - a) * target - a * (logit_sum / v_local), lse
