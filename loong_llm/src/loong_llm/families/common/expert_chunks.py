"""megatron-core's alltoall dispatcher without its identity reordering of the expert chunks.

After the all-to-all, ``MoEAlltoAllTokenDispatcher`` regroups the received tokens from
(source rank, local expert) order into (local expert, source rank) order, and back before the
combine, with ``sort_chunks_by_idxs``: a split into ``ranks x local experts`` chunks and a ``cat``
in the new order, for the tokens and for their routing probabilities. Where the tokens come from
one rank (expert parallelism and tensor parallelism of 1) that order is already the expert order,
yet each call still copies every routed token, and its backward splits and copies the gradient
again. In the Qwen3-MoE shape of ``benchmarks/peers_moe.py`` (4 MoE layers, 32 experts top-4,
2048 tokens per step, fp32, one rank) those ``cat`` calls took 257 ms of op time per 3 steps
(profiled with ``trainer.profile``). :func:`sort_chunks_by_idxs` returns its input unchanged when
the chunk order is the identity and calls megatron-core's otherwise: the values, and so the loss
and gradients, are bit-identical. :func:`install` routes the dispatcher through it (process-wide,
idempotent).
"""

from __future__ import annotations

import torch

_original = None


def is_identity(sorted_idxs: torch.Tensor) -> bool:
    """Whether the chunk order ``sorted_idxs`` leaves every chunk where it is."""
    n = sorted_idxs.numel()
    return bool(torch.equal(sorted_idxs.cpu(), torch.arange(n, dtype=sorted_idxs.dtype)))


def sort_chunks_by_idxs(input: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor,
                        probs: torch.Tensor | None = None, fused: bool = False):
    """megatron-core's ``sort_chunks_by_idxs`` (same arguments and result), without copying when
    ``sorted_idxs`` is the identity order."""
    if not fused and is_identity(sorted_idxs):
        return input, probs
    return _original(input, split_sizes, sorted_idxs, probs=probs, fused=fused)


def install() -> None:
    """Make megatron-core's token dispatchers call :func:`sort_chunks_by_idxs`."""
    global _original
    from megatron.core.transformer.moe import token_dispatcher

    current = token_dispatcher.sort_chunks_by_idxs
    if current is sort_chunks_by_idxs:
        return
    _original = current
    token_dispatcher.sort_chunks_by_idxs = sort_chunks_by_idxs
