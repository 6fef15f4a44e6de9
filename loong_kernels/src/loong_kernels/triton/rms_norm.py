"""RMSNorm in Triton, forward and backward, with an optional fused residual add.

``rms_norm(x, weight, eps, residual=None)``: statistics and the product with ``weight`` in fp32,
cast back to ``x``'s dtype. With ``residual`` the sum ``h = x + residual`` (rounded to the input
dtype, as the reference adds) is normalised and returned too: ``(norm(h), h)``. Each program
takes a ``[ROWS, BLOCK]`` tile of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import as_rows, block_for, programs_for, rows_for, warps_for


@triton.jit
def _forward(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, stride_h, n_rows, n_cols, eps,
             HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, W, RSTD, DH, DX, DW_PARTIAL, stride_dy, stride_x, stride_dh, stride_dx,
              n_rows, n_cols, blocks_per_program, HAS_DH: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for i in range(0, blocks_per_program):
        rows = ((pid * blocks_per_program + i) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)[:, None]
        xhat = x * rstd
        wdy = dy * w[None, :]
        dx = (wdy - xhat * (tl.sum(xhat * wdy, axis=1) / n_cols)[:, None]) * rstd
        if HAS_DH:
            dx += tl.load(DH + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid * n_cols + cols, tl.sum(dw, axis=0), mask=col_mask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, residual):
        shape = x.shape
        rows = as_rows(x)
        n_rows, n_cols = rows.shape
        block = block_for(n_cols)
        per = rows_for(block)
        y = torch.empty_like(rows)
        rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        if residual is not None:
            res = as_rows(residual)
            h = torch.empty_like(rows)
        else:
            res = h = rows  # unused by the kernel
        _forward[(triton.cdiv(n_rows, per),)](rows, res, weight, y, h, rstd, rows.stride(0), res.stride(0),
                                              y.stride(0), h.stride(0), n_rows, n_cols, eps,
                                              HAS_RESIDUAL=residual is not None, ROWS=per, BLOCK=block,
                                              num_warps=warps_for(per * block))
        ctx.save_for_backward(h if residual is not None else rows, weight, rstd)
        ctx.has_residual = residual is not None
        ctx.shape = shape
        if residual is not None:
            return y.view(shape), h.view(shape)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy, dh=None):
        normed, weight, rstd = ctx.saved_tensors
        n_rows, n_cols = normed.shape
        dy = as_rows(dy)
        has_dh = ctx.has_residual and dh is not None
        dh = as_rows(dh) if has_dh else dy
        dx = torch.empty_like(normed)
        block = block_for(n_cols)
        per = rows_for(block, 2048)
        row_blocks = triton.cdiv(n_rows, per)
        programs = programs_for(row_blocks, normed.device)
        blocks_per_program = triton.cdiv(row_blocks, programs)
        programs = triton.cdiv(row_blocks, blocks_per_program)
        dw_partial = torch.empty(programs, n_cols, device=normed.device, dtype=torch.float32)
        _backward[(programs,)](dy, normed, weight, rstd, dh, dx, dw_partial, dy.stride(0), normed.stride(0),
                               dh.stride(0), dx.stride(0), n_rows, n_cols, blocks_per_program, HAS_DH=has_dh,
                               ROWS=per, BLOCK=block, num_warps=warps_for(per * block))
        dw = dw_partial.sum(0).to(weight.dtype)
        dx = dx.view(ctx.shape)
        return dx, dw, None, (dx if ctx.has_residual else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, times ``weight``; see the module docstring.

    Args:
        x: Input ``[..., d]``.
        weight: Scale ``[d]``.
        eps: Added to the mean square.
        residual: Optional tensor of ``x``'s shape added to ``x`` before the norm.

    Returns:
        ``norm(x)``, or ``(norm(x + residual), x + residual)`` with ``residual``.
    """
    return _RMSNorm.apply(x, weight, float(eps), residual)
