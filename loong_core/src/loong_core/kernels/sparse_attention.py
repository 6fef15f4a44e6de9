"""Torch references of DeepSeek sparse attention (DSA): attention over selected keys and the
lightning indexer's causal top-k, neither holding an ``[s, s]`` matrix.

Layouts are megatron-core's: ``q, k [s, b, h, d]``, ``v [s, b, h, dv]``; ``indices [b, s, topk]``
lists, per query, the positions of the keys it attends to (positions after the query are ignored,
so the top-k of a short prefix may list anything there).

Attention walks the queries in chunks. Keys and values are first laid out head-major
(``[b * h * s, d]``, one copy of the inputs), so a chunk's selected rows are one ``index_select``
into ``[b, h, c, topk, d]`` and every product is a plain batched matmul, no per-chunk transposes.
Only the columns of a chunk that hold a causal selection are computed (a sorted top-k puts them
first: early queries cost what their prefix costs). The forward keeps the output and the
log-sum-exp; the backward recomputes a chunk's scores and adds the key/value gradients with
``index_add_``. Transient memory is bounded by :data:`CHUNK_ELEMENTS` (O(topk), not O(s)).
"""

from __future__ import annotations

import torch

#: Elements of one chunk's gathered keys (``rows x topk x heads x dim``): about 16 MiB in fp32.
CHUNK_ELEMENTS = 1 << 22


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32, or the input's when wider."""
    return torch.promote_types(dtype, torch.float32)


def chunk_rows(seq: int, per_row: int) -> int:
    """Query rows per chunk when one row costs ``per_row`` elements."""
    return max(1, min(seq, CHUNK_ELEMENTS // max(per_row, 1)))


def valid_selection(indices: torch.Tensor) -> torch.Tensor:
    """``[b, s, topk]`` bool: the selected key is at or before its query (causal)."""
    positions = torch.arange(indices.shape[1], device=indices.device).view(1, -1, 1)
    return indices <= positions


def head_major(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[s, b, h, d]`` -> contiguous ``[b * h * s, d]`` rows in ``dtype``."""
    s, b, h, d = x.shape
    return x.permute(1, 2, 0, 3).to(dtype).reshape(b * h * s, d)


class Chunk:
    """The selected rows of one query chunk ``[start, end)`` in head-major flat form.

    Attributes:
        flat: ``[b, h, c, n]`` int64 rows into a ``[b * h * s, d]`` table.
        valid: ``[b, 1, c, n]`` bool, the causal selections.
        n: Columns kept (those up to the last causal selection of the chunk).
    """

    def __init__(self, rows: torch.Tensor, valid: torch.Tensor, start: int, end: int, h: int):
        b, s = rows.shape[:2]
        v = valid[:, start:end]
        used = v.any(dim=1).any(dim=0).nonzero()
        n = int(used[-1]) + 1 if used.numel() else 1
        self.n, self.valid = n, v[:, None, :, :n]
        base = (torch.arange(b * h, device=rows.device) * s).view(b, h, 1, 1)
        self.flat = base + rows[:, None, start:end, :n]

    def gather(self, table: torch.Tensor) -> torch.Tensor:
        """``[b, h, c, n, d]`` rows of ``table [b * h * s, d]``."""
        return table.index_select(0, self.flat.reshape(-1)).view(*self.flat.shape, table.shape[-1])

    def scores(self, q_c: torch.Tensor, k_g: torch.Tensor, scale: float) -> torch.Tensor:
        """``[b, h, c, n]`` scaled scores of ``q_c [b, h, c, d]`` (invalid: -inf)."""
        scores = (k_g @ q_c.unsqueeze(-1)).squeeze(-1) * scale
        return scores.masked_fill(~self.valid, float("-inf"))


def _chunks(indices: torch.Tensor, h: int, width: int):
    b, s, topk = indices.shape
    rows, valid = indices.clamp(0, s - 1), valid_selection(indices)
    step = chunk_rows(s, b * topk * h * width)
    for start in range(0, s, step):
        end = min(s, start + step)
        yield start, end, Chunk(rows, valid, start, end, h)


class SparseAttention(torch.autograd.Function):
    """Softmax attention of each query over its selected keys (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, indices, scale: float):
        s, b, h, d = q.shape
        acc = acc_dtype(q.dtype)
        qh = q.permute(1, 2, 0, 3).to(acc)  # [b, h, s, d] (a view when already fp32)
        kt, vt = head_major(k, acc), head_major(v, acc)
        out = torch.empty(b, h, s, v.shape[-1], dtype=acc, device=q.device)
        lse = torch.empty(b, h, s, dtype=acc, device=q.device)
        for start, end, ch in _chunks(indices, h, d + v.shape[-1]):
            scores = ch.scores(qh[:, :, start:end], ch.gather(kt), scale)
            lse_c = torch.logsumexp(scores, dim=-1)
            probs = torch.exp(scores - lse_c.unsqueeze(-1))
            out[:, :, start:end] = (probs.unsqueeze(-2) @ ch.gather(vt)).squeeze(-2)
            lse[:, :, start:end] = lse_c
        ctx.save_for_backward(q, k, v, indices, out, lse)
        ctx.scale = scale
        return out.permute(2, 0, 1, 3).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, indices, out, lse = ctx.saved_tensors
        s, b, h, d = q.shape
        acc = acc_dtype(q.dtype)
        qh = q.permute(1, 2, 0, 3).to(acc)
        kt, vt = head_major(k, acc), head_major(v, acc)
        g = grad_out.permute(1, 2, 0, 3).to(acc)  # [b, h, s, dv]
        delta = (g * out).sum(-1)  # [b, h, s]
        dq = torch.empty(b, h, s, d, dtype=acc, device=q.device)
        dk, dv = torch.zeros_like(kt), torch.zeros_like(vt)
        scale = ctx.scale
        for start, end, ch in _chunks(indices, h, 2 * (d + v.shape[-1])):
            q_c, g_c = qh[:, :, start:end], g[:, :, start:end]
            k_g, v_g = ch.gather(kt), ch.gather(vt)
            probs = torch.exp(ch.scores(q_c, k_g, scale) - lse[:, :, start:end, None])
            dp = (v_g @ g_c.unsqueeze(-1)).squeeze(-1)
            ds = probs * (dp - delta[:, :, start:end, None]) * scale
            dq[:, :, start:end] = (ds.unsqueeze(-2) @ k_g).squeeze(-2)
            flat = ch.flat.reshape(-1)
            dv.index_add_(0, flat, (probs.unsqueeze(-1) * g_c.unsqueeze(-2)).view(-1, vt.shape[-1]))
            dk.index_add_(0, flat, (ds.unsqueeze(-1) * q_c.unsqueeze(-2)).view(-1, d))

        def seq_major(t, like):
            return t.view(b, h, s, -1).permute(2, 0, 1, 3).to(like.dtype)

        return seq_major(dq, q), seq_major(dk, k), seq_major(dv, v), None, None


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Attention of each query over the keys ``indices`` selects (causal: later ones ignored).

    Args:
        q, k: ``[s, b, h, d]``.
        v: ``[s, b, h, dv]``.
        indices: ``[b, s, topk]`` key positions per query; ``topk >= s`` with every position is
            dense causal attention.
        scale: Softmax scale.

    Returns:
        ``[s, b, h, dv]`` in ``q``'s dtype.
    """
    return SparseAttention.apply(q, k, v, indices.long(), float(scale))


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[b, c, t]`` lightning-indexer scores ``sum_h w[i, h] relu(q[i, h] . k[j])`` of the
    queries ``q [c, b, H, D]`` (weights ``w [c, b, H]``) against the keys ``k [t, b, D]``."""
    c, b, heads, _ = q.shape
    dots = torch.relu(q.permute(1, 0, 2, 3).reshape(b, c * heads, -1) @ k.permute(1, 2, 0))
    return (w.permute(1, 0, 2).reshape(b * c, 1, heads) @ dots.view(b * c, heads, -1)).view(b, c, -1)


@torch.no_grad()
def indexer_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, topk: int) -> torch.Tensor:
    """Each query's ``topk`` highest-scoring keys at or before it, a chunk of queries at a time.

    Args:
        q: ``[s, b, H, D]`` indexer queries.
        k: ``[s, b, D]`` the shared indexer key.
        w: ``[s, b, H]`` per-head weights (scales folded in).
        topk: Keys per query.

    Returns:
        ``[b, s, min(topk, s)]`` int64, best first; a query with fewer earlier keys than
        ``topk`` also lists later ones (after its own; attention ignores them).
    """
    s, b, heads, _ = q.shape
    k_top = min(topk, s)
    out = torch.empty(b, s, k_top, dtype=torch.long, device=q.device)
    step = chunk_rows(s, b * heads * s)
    for start in range(0, s, step):
        end = min(s, start + step)
        t = max(end, k_top)  # keys after the chunk's last query are never causal
        scores = indexer_scores(q[start:end], k[:t], w[start:end])
        future = torch.arange(t, device=q.device)[None, :] > torch.arange(start, end, device=q.device)[:, None]
        out[:, start:end] = scores.masked_fill_(future, float("-inf")).topk(k_top, dim=-1).indices
    return out
