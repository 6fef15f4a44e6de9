"""Autograd-correct collectives along the sequence, shared by both engines' sequence sharding
(context parallelism on the megatron engine, Ulysses on the torch engine)."""

from __future__ import annotations

import torch
import torch.distributed as dist


class GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; backward reduce-scatters the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // ctx.group.size(), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad, group=ctx.group)
        return out, None
