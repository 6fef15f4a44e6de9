"""Whether a step's gradients are finite, checked before the optimizer may apply them."""

from __future__ import annotations

import torch


def grads_finite(model_chunks: list) -> bool:
    """True when every gradient in the chunks' megatron-core DDP buffers is finite on every rank.

    One ``isfinite`` reduction per contiguous gradient buffer and one all-reduce of a flag, so
    every rank reaches the same decision (a NaN on one rank poisons the reduced gradients of all).
    """
    grads = [buffer.grad_data for chunk in model_chunks
             for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]]
    bad = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else "cpu")
    for grad in grads:
        bad = torch.maximum(bad, (~torch.isfinite(grad)).any().float().reshape(1))
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    return bad.item() == 0
