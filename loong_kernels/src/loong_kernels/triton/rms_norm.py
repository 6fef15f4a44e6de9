"""RMSNorm in Triton, forward and backward, with an optional fused residual add.

``rms_norm(x, weight, eps, residual=None)``: statistics and the product with ``weight`` in fp32,
cast back to ``x``'s dtype. With ``residual`` the sum ``h = x + residual`` (rounded to the input
dtype, as the reference adds) is normalised and returned too: ``(norm(h), h)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import as_rows, block_for, programs_for, warps_for


@triton.jit
def _forward(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, stride_h, n_cols, eps,
             HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H.dtype.element_ty)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, W, RSTD, DH, DX, DW_PARTIAL, stride_dy, stride_x, stride_dh, stride_dx,
              n_rows, n_cols, rows_per_program, HAS_DH: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    start = pid * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    for r in range(start, end):
        row = tl.cast(r, tl.int64)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        wdy = dy * w
        dx = (wdy - xhat * (tl.sum(xhat * wdy, axis=0) / n_cols)) * rstd
        if HAS_DH:
            dx += tl.load(DH + row * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid * n_cols + cols, dw, mask=mask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, residual):
        shape = x.shape
        rows = as_rows(x)
        n_rows, n_cols = rows.shape
        block = block_for(n_cols)
        y = torch.empty_like(rows)
        rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        if residual is not None:
            res = as_rows(residual)
            h = torch.empty_like(rows)
        else:
            res = h = rows  # unused by the kernel
        _forward[(n_rows,)](rows, res, weight, y, h, rstd, rows.stride(0), res.stride(0), y.stride(0),
                            h.stride(0), n_cols, eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                            num_warps=warps_for(block))
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
        programs = programs_for(n_rows, normed.device)
        per_program = triton.cdiv(n_rows, programs)
        programs = triton.cdiv(n_rows, per_program)
        dw_partial = torch.empty(programs, n_cols, device=normed.device, dtype=torch.float32)
        block = block_for(n_cols)
        _backward[(programs,)](dy, normed, weight, rstd, dh, dx, dw_partial, dy.stride(0), normed.stride(0),
                               dh.stride(0), dx.stride(0), n_rows, n_cols, per_program, HAS_DH=has_dh,
                               BLOCK=block, num_warps=warps_for(block))
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
