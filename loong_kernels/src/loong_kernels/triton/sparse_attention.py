"""DeepSeek sparse attention in Triton: each query attends to its ``topk`` selected keys.

One program per (query, batch x head) walks the query's selection ``BLOCK_K`` keys at a time,
loads those key rows directly from the head-major key table (no gathered copy) and keeps an
online softmax, so only the output and the log-sum-exp are stored. The backward recomputes the
probabilities from the log-sum-exp, writes ``dq`` per query and adds ``dk`` / ``dv`` into fp32
tables with atomics (a key is selected by many queries). Keys after their query are ignored
(causal), as in the reference :func:`loong_core.kernels.reference.sparse_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import block_for

_NEG = -1.0e30  # running-max start: finite, so a block of only masked keys gives exp(-inf) = 0


@triton.jit
def _scores(Q, K, IDX, bh, b, i, kk, d, S, TOPK, D, scale):
    """Scores of query ``i`` against the selected keys ``kk`` (masked: -inf) and their rows."""
    q = tl.load(Q + (bh * S + i) * D + d, mask=d < D, other=0.0).to(tl.float32)
    in_k = kk < TOPK
    j = tl.load(IDX + (b * S + i) * TOPK + kk, mask=in_k, other=0)
    ok = in_k & (j <= i)
    row = bh * S + tl.minimum(tl.maximum(j, 0), S - 1)
    kt = tl.load(K + row[:, None] * D + d[None, :], mask=ok[:, None] & (d < D)[None, :], other=0.0)
    s = tl.sum(kt.to(tl.float32) * q[None, :], axis=1) * scale
    return tl.where(ok, s, float("-inf")), row, ok, q, kt.to(tl.float32)


@triton.jit
def _forward(Q, K, V, IDX, OUT, LSE, scale, S, H, TOPK, D, DV,
             BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    d, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    m = tl.max(tl.full([BLOCK_K], _NEG, tl.float32), axis=0)
    total = tl.sum(tl.zeros([BLOCK_K], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    for start in range(0, TOPK, BLOCK_K):
        kk = start + tl.arange(0, BLOCK_K)
        s, row, ok, _, _ = _scores(Q, K, IDX, bh, b, i, kk, d, S, TOPK, D, scale)
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        vt = tl.load(V + row[:, None] * DV + dv[None, :], mask=ok[:, None] & (dv < DV)[None, :], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * vt.to(tl.float32), axis=0)
        total = total * alpha + tl.sum(p, axis=0)
        m = m_new
    tl.store(OUT + (bh * S + i) * DV + dv, acc / total, mask=dv < DV)
    tl.store(LSE + bh * S + i, m + tl.log(total))


@triton.jit
def _backward(Q, K, V, IDX, DO, LSE, DELTA, DQ, DK, DV_, scale, S, H, TOPK, D, DV,
              BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    d, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    do = tl.load(DO + (bh * S + i) * DV + dv, mask=dv < DV, other=0.0)
    lse = tl.load(LSE + bh * S + i)
    delta = tl.load(DELTA + bh * S + i)
    dq = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, TOPK, BLOCK_K):
        kk = start + tl.arange(0, BLOCK_K)
        s, row, ok, q, kt = _scores(Q, K, IDX, bh, b, i, kk, d, S, TOPK, D, scale)
        p = tl.exp(s - lse)
        v_mask = ok[:, None] & (dv < DV)[None, :]
        vt = tl.load(V + row[:, None] * DV + dv[None, :], mask=v_mask, other=0.0).to(tl.float32)
        ds = p * (tl.sum(vt * do[None, :], axis=1) - delta) * scale
        dq += tl.sum(ds[:, None] * kt, axis=0)
        tl.atomic_add(DV_ + row[:, None] * DV + dv[None, :], p[:, None] * do[None, :], mask=v_mask)
        tl.atomic_add(DK + row[:, None] * D + d[None, :], ds[:, None] * q[None, :],
                      mask=ok[:, None] & (d < D)[None, :])
    tl.store(DQ + (bh * S + i) * D + d, dq, mask=d < D)


def _head_major(x: torch.Tensor) -> torch.Tensor:
    """``[s, b, h, d]`` -> contiguous ``[b * h, s, d]``."""
    s, b, h, d = x.shape
    return x.permute(1, 2, 0, 3).reshape(b * h, s, d).contiguous()


def _seq_major(x: torch.Tensor, b: int, h: int, dtype: torch.dtype) -> torch.Tensor:
    """``[b * h, s, d]`` -> ``[s, b, h, d]`` in ``dtype``."""
    return x.view(b, h, x.shape[1], x.shape[2]).permute(2, 0, 1, 3).to(dtype)


def _blocks(topk: int, d: int, dv: int) -> dict:
    return dict(BLOCK_K=min(64, block_for(topk)), BLOCK_D=block_for(d), BLOCK_DV=block_for(dv))


class _SparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, indices, scale):
        s, b, h, d = q.shape
        dv = v.shape[-1]
        qh, kh, vh = _head_major(q), _head_major(k), _head_major(v)
        idx = indices.contiguous()
        out = torch.empty(b * h, s, dv, device=q.device, dtype=torch.float32)
        lse = torch.empty(b * h, s, device=q.device, dtype=torch.float32)
        _forward[(s, b * h)](qh, kh, vh, idx, out, lse, scale, s, h, idx.shape[-1], d, dv,
                             **_blocks(idx.shape[-1], d, dv))
        ctx.save_for_backward(qh, kh, vh, idx, out, lse)
        ctx.scale, ctx.dims = scale, (b, h, q.dtype, k.dtype, v.dtype)
        return _seq_major(out, b, h, q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        qh, kh, vh, idx, out, lse = ctx.saved_tensors
        b, h, q_dtype, k_dtype, v_dtype = ctx.dims
        s, d, dv = qh.shape[1], qh.shape[2], vh.shape[2]
        do = _head_major(grad_out.float())
        delta = (do * out).sum(-1)
        dq = torch.empty(b * h, s, d, device=qh.device, dtype=torch.float32)
        dk = torch.zeros(b * h, s, d, device=qh.device, dtype=torch.float32)
        dvt = torch.zeros(b * h, s, dv, device=qh.device, dtype=torch.float32)
        _backward[(s, b * h)](qh, kh, vh, idx, do, lse, delta, dq, dk, dvt, ctx.scale, s, h,
                              idx.shape[-1], d, dv, **_blocks(idx.shape[-1], d, dv))
        return (_seq_major(dq, b, h, q_dtype), _seq_major(dk, b, h, k_dtype),
                _seq_major(dvt, b, h, v_dtype), None, None)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Attention of each query over the keys ``indices`` selects (later keys ignored).

    Args:
        q, k: ``[s, b, h, d]``.
        v: ``[s, b, h, dv]``.
        indices: ``[b, s, topk]`` key positions per query.
        scale: Softmax scale.

    Returns:
        ``[s, b, h, dv]`` in ``q``'s dtype.
    """
    return _SparseAttention.apply(q, k, v, indices.long(), float(scale))
