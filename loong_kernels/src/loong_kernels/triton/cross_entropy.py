"""Vocab-parallel cross entropy in Triton, forward and backward (megatron-core's semantics).

Two row kernels serve this op and the tiles of :mod:`loong_kernels.triton.linear_cross_entropy`:
``tile_stats`` folds a ``[rows, v]`` block of logits into running per-row statistics (online max /
sum-exp, target logit, logit sum) and ``tile_grad`` writes ``g * (softmax - (1 - a) * onehot - a / V)``
for a block, in place if asked. :mod:`loong_kernels.vocab` turns the statistics into the loss
across the tensor-parallel group.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels import vocab
from loong_kernels.triton._launch import as_rows, block_for, rows_for

_BLOCK = 2048


@triton.jit
def _stats(Z, LABELS, STATS, n_rows, n_cols, stride_z, stride_stats, col_offset, ROWS: tl.constexpr,
           BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    target = (tl.load(LABELS + rows, mask=row_mask, other=0) - col_offset)[:, None]
    m = tl.load(STATS + rows, mask=row_mask, other=0.0)
    acc = tl.load(STATS + stride_stats + rows, mask=row_mask, other=0.0)
    z_target = tl.load(STATS + 2 * stride_stats + rows, mask=row_mask, other=0.0)
    z_sum = tl.load(STATS + 3 * stride_stats + rows, mask=row_mask, other=0.0)
    for start in range(0, n_cols, BLOCK):
        cols = (start + tl.arange(0, BLOCK))[None, :]
        mask = row_mask[:, None] & (cols < n_cols)
        z = tl.load(Z + rows[:, None] * stride_z + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        # rows past the end stay at -inf: keep their arithmetic finite
        m_safe = tl.where(row_mask, m_new, 0.0)
        acc = acc * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe[:, None]), axis=1)
        m = m_new
        z_sum += tl.sum(tl.where(mask, z, 0.0), axis=1)
        z_target += tl.sum(tl.where((cols == target) & mask, z, 0.0), axis=1)
    tl.store(STATS + rows, m, mask=row_mask)
    tl.store(STATS + stride_stats + rows, acc, mask=row_mask)
    tl.store(STATS + 2 * stride_stats + rows, z_target, mask=row_mask)
    tl.store(STATS + 3 * stride_stats + rows, z_sum, mask=row_mask)


@triton.jit
def _grad(Z, DZ, LABELS, LSE, G, n_rows, n_cols, stride_z, stride_dz, col_offset, target_weight, uniform,
          ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    target = (tl.load(LABELS + rows, mask=row_mask, other=0) - col_offset)[:, None]
    lse = tl.load(LSE + rows, mask=row_mask, other=0.0)[:, None]
    g = tl.load(G + rows, mask=row_mask, other=0.0)[:, None]
    for start in range(0, n_cols, BLOCK):
        cols = (start + tl.arange(0, BLOCK))[None, :]
        mask = row_mask[:, None] & (cols < n_cols)
        z = tl.load(Z + rows[:, None] * stride_z + cols, mask=mask, other=0.0).to(tl.float32)
        d = tl.exp(z - lse) - uniform - tl.where(cols == target, target_weight, 0.0)
        tl.store(DZ + rows[:, None] * stride_dz + cols, (d * g).to(DZ.dtype.element_ty), mask=mask)


def _tile(n_cols: int) -> tuple[int, int]:
    """``(rows, block)`` of a program: up to 2048 columns at a time, rows to fill 4096 elements."""
    block = min(_BLOCK, block_for(n_cols))
    return rows_for(block), block


def tile_stats(z: torch.Tensor, labels: torch.Tensor, col_offset: int, stats: torch.Tensor) -> None:
    """Fold logits ``z [n, v]`` into ``stats [4, n]`` (see :func:`loong_kernels.vocab.new_stats`).

    Args:
        z: Logits of columns ``col_offset .. col_offset + v`` of the shard, unit last stride.
        labels: ``[n]`` int64 targets relative to the shard start.
        col_offset: Shard column of ``z[:, 0]``.
        stats: Running statistics, unit stride along rows; updated in place.
    """
    rows, block = _tile(z.shape[1])
    _stats[(triton.cdiv(z.shape[0], rows),)](z, labels, stats, z.shape[0], z.shape[1], z.stride(0), stats.stride(0),
                                             col_offset, ROWS=rows, BLOCK=block, num_warps=8)


def tile_grad(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, col_offset: int, lse: torch.Tensor,
              grad: torch.Tensor, target_weight: float, uniform: float) -> None:
    """Write the logits gradient of a tile into ``out`` (which may be ``z`` itself).

    Args:
        z: Logits ``[n, v]``.
        out: ``[n, v]`` output, unit last stride.
        labels: ``[n]`` int64 targets relative to the shard start.
        col_offset: Shard column of ``z[:, 0]``.
        lse: ``[n]`` fp32 global log-sum-exp.
        grad: ``[n]`` fp32 gradient of the per-token loss.
        target_weight: ``1 - a`` subtracted at the target.
        uniform: ``a / V_local`` subtracted everywhere.
    """
    rows, block = _tile(z.shape[1])
    _grad[(triton.cdiv(z.shape[0], rows),)](z, out, labels, lse, grad, z.shape[0], z.shape[1], z.stride(0),
                                            out.stride(0), col_offset, target_weight, uniform, ROWS=rows,
                                            BLOCK=block, num_warps=8)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, label_smoothing, group):
        z = as_rows(logits)
        v_local = z.shape[1]
        local_labels = (labels.reshape(-1).long() - vocab.shard_start(v_local, group)).contiguous()
        stats = vocab.new_stats(z.shape[0], z.device)
        tile_stats(z, local_labels, 0, stats)
        loss, lse = vocab.finish(stats, v_local, label_smoothing, group)
        ctx.save_for_backward(z, local_labels, lse)
        ctx.a = vocab.smoothing_coefficient(label_smoothing, v_local)
        ctx.shape = logits.shape
        return loss.view(labels.shape)

    @staticmethod
    def backward(ctx, grad):
        z, local_labels, lse = ctx.saved_tensors
        out = torch.empty_like(z)
        tile_grad(z, out, local_labels, 0, lse, grad.reshape(-1).float().contiguous(), 1.0 - ctx.a,
                  ctx.a / z.shape[1])
        return out.view(ctx.shape), None, None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0, group=None):
    """Per-token cross entropy of (vocab-parallel) logits, as megatron-core's ``vocab_parallel_cross_entropy``.

    Args:
        logits: ``[..., V_local]``, this rank's contiguous vocab shard.
        labels: ``[...]`` global target ids.
        label_smoothing: In ``[0, 1)``.
        group: Tensor-parallel group the vocab is split over (None: the whole vocab is here).

    Returns:
        fp32 loss ``[...]``.
    """
    return _CrossEntropy.apply(logits, labels, float(label_smoothing), group)
