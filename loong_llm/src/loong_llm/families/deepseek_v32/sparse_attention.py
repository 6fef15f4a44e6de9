"""Attention over the keys an indexer selected, through the kernel seam's ``sparse_attention``
op (``kernels.sparse_attention``: the chunked torch reference of
:mod:`loong_core.kernels.sparse_attention`, or ``triton``), and the head-summed attention
distribution the indexer's loss is fitted to.

Layout is megatron-core's: ``q, k [s, b, h, d]``, ``v [s, b, h, dv]``; ``indices [b, s, topk]``
holds, for each query, the positions of the keys it attends to (positions after the query are
ignored). No ``[s, s]`` matrix exists; with ``topk >= s`` it is dense causal attention.
"""

from __future__ import annotations

import torch

from loong_core import kernels
from loong_core.kernels.sparse_attention import Chunk, acc_dtype, chunk_rows, valid_selection

__all__ = ["sparse_attention", "head_summed_probs", "valid_selection"]


def sparse_attention(q, k, v, indices, scale: float) -> torch.Tensor:
    """``[s, b, h, dv]``: attention of each query over the keys ``indices`` selects."""
    return kernels.get("sparse_attention")(q, k, v, indices.long(), float(scale))


@torch.no_grad()
def head_summed_probs(q, k, indices, scale: float) -> torch.Tensor:
    """``[b, s, topk]``: the attention probability of each selected key summed over this rank's
    heads (0 for an invalid selection); the target of the sparse indexer loss."""
    s, b, h, d = q.shape
    acc = acc_dtype(q.dtype)
    qh = q.permute(1, 2, 0, 3).to(acc)
    kt = k.permute(1, 2, 0, 3).to(acc).reshape(b * h * s, d)
    rows, valid = indices.clamp(0, s - 1), valid_selection(indices)
    out = torch.zeros(b, s, indices.shape[-1], dtype=acc, device=q.device)
    step = chunk_rows(s, b * indices.shape[-1] * h * d)
    for start in range(0, s, step):
        end = min(s, start + step)
        ch = Chunk(rows, valid, start, end, h)
        probs = torch.softmax(ch.scores(qh[:, :, start:end], ch.gather(kt), scale), dim=-1)
        out[:, start:end, : ch.n] = probs.sum(dim=1)
    return out
