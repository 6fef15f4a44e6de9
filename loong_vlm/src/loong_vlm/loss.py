"""Token loss and prediction accuracy from (tensor-parallel) logits."""

from __future__ import annotations

import torch


@torch.no_grad()
def correct_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Whether the arg-max of the logits is the label, with the vocabulary split over TP ranks.

    Args:
        logits: ``[..., vocab / tp]``, this rank's vocabulary shard.
        labels: ``[...]`` token ids of the full vocabulary.

    Returns:
        Bool ``[...]``, the same on every TP rank (a tie with the label counts as correct).
    """
    from megatron.core import parallel_state as ps

    part = logits.shape[-1]
    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    start = (ps.get_tensor_model_parallel_rank() if tp > 1 else 0) * part
    local = labels - start
    in_range = (local >= 0) & (local < part)
    target = logits.gather(-1, local.clamp(0, part - 1).unsqueeze(-1)).squeeze(-1).float()
    target = torch.where(in_range, target, torch.zeros_like(target))
    best = logits.max(dim=-1).values.float()
    if tp > 1:
        group = ps.get_tensor_model_parallel_group()
        torch.distributed.all_reduce(target, group=group)
        torch.distributed.all_reduce(best, op=torch.distributed.ReduceOp.MAX, group=group)
    return target >= best


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy ``[...]`` in fp32 (vocabulary-parallel softmax), through
    ``kernels.cross_entropy`` when that op is not plain."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from loong_core import kernels

    if kernels.is_plain("cross_entropy"):
        return tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)
    tp = ps.get_tensor_model_parallel_world_size() if ps.model_parallel_is_initialized() else 1
    group = ps.get_tensor_model_parallel_group() if tp > 1 else None
    return kernels.get("cross_entropy")(logits, labels, group=group)
