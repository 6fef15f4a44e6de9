"""Attention over the keys an indexer selected, without an ``[s, s]`` score matrix.

Layout is megatron-core's: ``q, k [s, b, h, d]``, ``v [s, b, h, dv]``; ``indices [b, s, topk]``
holds, for each query, the positions of the keys it attends to (positions after the query are
ignored, so a causal top-k over a short prefix may hold anything there). The forward walks the
queries in chunks, gathers the selected keys and values of a chunk, and keeps only the output and
the log-sum-exp per query and head; the backward recomputes each chunk's scores. Peak memory is
``O(chunk * topk * h * d)`` on top of the inputs, and what is kept for the backward
``O(s * h)`` beyond them: with ``topk >= s`` it computes dense causal attention.
"""

from __future__ import annotations

import torch

#: Query rows x selected keys gathered at once (bounds the transient memory of a chunk).
CHUNK_ELEMENTS = 1 << 16


def _chunk(seq: int, topk: int) -> int:
    return max(1, min(seq, CHUNK_ELEMENTS // max(topk, 1)))


def valid_selection(indices: torch.Tensor) -> torch.Tensor:
    """``[b, s, topk]`` bool: the selected key is at or before its query (causal)."""
    positions = torch.arange(indices.shape[1], device=indices.device).view(1, -1, 1)
    return indices <= positions


def _gather(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x [b, s, h, d]`` at ``rows [b, c, k]`` -> ``[b, c, k, h, d]``."""
    b = x.shape[0]
    batch = torch.arange(b, device=x.device).view(b, 1, 1)
    return x[batch, rows]


def _scatter_add(target: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """``target [b, s, h, d] += values [b, c, k, h, d]`` at ``rows [b, c, k]``."""
    b, s = target.shape[:2]
    flat = (rows + torch.arange(b, device=rows.device).view(b, 1, 1) * s).reshape(-1)
    target.view(b * s, *target.shape[2:]).index_add_(0, flat, values.reshape(-1, *values.shape[3:]))


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32, or the input's when wider."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_scores(q_c, k_g, valid_c, scale):
    """Scores ``[b, c, h, k]`` of a query chunk against its gathered keys (invalid: -inf)."""
    acc = _acc(q_c.dtype)
    scores = torch.einsum("bchd,bckhd->bchk", q_c.to(acc), k_g.to(acc)) * scale
    return scores.masked_fill(~valid_c.unsqueeze(2), float("-inf"))


class SparseAttention(torch.autograd.Function):
    """Softmax attention of each query over its selected keys (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, indices, scale: float):
        qb, kb, vb = (t.transpose(0, 1) for t in (q, k, v))  # [b, s, h, d]
        b, s, h, _ = qb.shape
        rows = indices.clamp(0, s - 1)
        valid = valid_selection(indices)
        out = torch.empty(b, s, h, vb.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(b, s, h, dtype=_acc(q.dtype), device=q.device)
        step = _chunk(s, indices.shape[-1])
        for start in range(0, s, step):
            end = min(s, start + step)
            r, m = rows[:, start:end], valid[:, start:end]
            scores = _chunk_scores(qb[:, start:end], _gather(kb, r), m, scale)
            lse_c = torch.logsumexp(scores, dim=-1)  # [b, c, h]
            probs = torch.exp(scores - lse_c.unsqueeze(-1))
            out[:, start:end] = torch.einsum("bchk,bckhd->bchd", probs, _gather(vb, r).to(probs.dtype)).to(q.dtype)
            lse[:, start:end] = lse_c
        ctx.save_for_backward(q, k, v, rows, valid, out, lse)
        ctx.scale = scale
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, rows, valid, out, lse = ctx.saved_tensors
        scale = ctx.scale
        qb, kb, vb = (t.transpose(0, 1) for t in (q, k, v))
        acc = _acc(q.dtype)
        grad_b = grad_out.transpose(0, 1).to(acc)
        b, s, h, _ = qb.shape
        dq = torch.zeros(qb.shape, dtype=acc, device=q.device)
        dk = torch.zeros(kb.shape, dtype=acc, device=q.device)
        dv = torch.zeros(vb.shape, dtype=acc, device=q.device)
        delta = (grad_b * out.to(acc)).sum(-1)  # [b, s, h]
        step = _chunk(s, rows.shape[-1])
        for start in range(0, s, step):
            end = min(s, start + step)
            r, m = rows[:, start:end], valid[:, start:end]
            k_g, v_g = _gather(kb, r).to(acc), _gather(vb, r).to(acc)
            scores = _chunk_scores(qb[:, start:end], k_g, m, scale)
            probs = torch.exp(scores - lse[:, start:end].unsqueeze(-1))  # [b, c, h, k]
            g = grad_b[:, start:end]
            _scatter_add(dv, r, torch.einsum("bchk,bchd->bckhd", probs, g))
            dp = torch.einsum("bchd,bckhd->bchk", g, v_g)
            ds = probs * (dp - delta[:, start:end].unsqueeze(-1)) * scale
            dq[:, start:end] = torch.einsum("bchk,bckhd->bchd", ds, k_g)
            _scatter_add(dk, r, torch.einsum("bchk,bchd->bckhd", ds, qb[:, start:end].to(acc)))
        return (dq.to(q.dtype).transpose(0, 1), dk.to(k.dtype).transpose(0, 1),
                dv.to(v.dtype).transpose(0, 1), None, None)


def sparse_attention(q, k, v, indices, scale: float) -> torch.Tensor:
    """``[s, b, h, dv]``: attention of each query over the keys ``indices`` selects."""
    return SparseAttention.apply(q, k, v, indices.long(), float(scale))


@torch.no_grad()
def head_summed_probs(q, k, indices, scale: float) -> torch.Tensor:
    """``[b, s, topk]``: the attention probability of each selected key summed over this rank's
    heads (0 for an invalid selection); the target of the sparse indexer loss."""
    qb, kb = q.transpose(0, 1), k.transpose(0, 1)
    b, s, h, _ = qb.shape
    rows, valid = indices.clamp(0, s - 1), valid_selection(indices)
    out = torch.empty(b, s, indices.shape[-1], dtype=_acc(q.dtype), device=q.device)
    step = _chunk(s, indices.shape[-1])
    for start in range(0, s, step):
        end = min(s, start + step)
        scores = _chunk_scores(qb[:, start:end], _gather(kb, rows[:, start:end]), valid[:, start:end], scale)
        out[:, start:end] = torch.softmax(scores, dim=-1).sum(dim=2)
    return out
