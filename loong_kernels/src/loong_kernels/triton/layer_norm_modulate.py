"""LayerNorm + adaLN modulation in Triton: ``LN(x) * (1 + scale) + shift``, forward and backward.

``x`` is ``[..., s, d]``; ``shift`` and ``scale`` broadcast against it (``[b, 1, d]`` per sample or
``[b, s, d]`` per token, or anything broadcastable). Statistics and products in fp32, one rounding
to ``x``'s dtype. The backward reduces the gradients of broadcast ``shift``/``scale`` over the
sequence inside the kernel (per-program partials, summed by torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import block_for, programs_for, rows_for, warps_for


@triton.jit
def _forward(X, W, B, SHIFT, SCALE, Y, MEAN, RSTD, n_rows, n_s, n_cols, eps, stride_mb, stride_ms,
             HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # x / y are contiguous [b * s, d]; shift / scale are read through their [b, s] strides.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.math.rsqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    mod = ((rows // n_s) * stride_mb + (rows % n_s) * stride_ms)[:, None] + cols[None, :]
    scale = tl.load(SCALE + mod, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + mod, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (y * (1.0 + scale) + shift).to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _backward(DY, X, W, B, SCALE, MEAN, RSTD, DX, DSHIFT, DSCALE, PARTIAL, n_s, n_cols, blocks_per_program,
              chunks_per_b, stride_mb, stride_ms, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
              PER_TOKEN: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # Program (b, chunk) takes blocks_per_program tiles of ROWS positions of sample b.
    pid = tl.program_id(0)
    b = (pid // chunks_per_b).to(tl.int64)
    first = (pid % chunks_per_b) * blocks_per_program * ROWS
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        w = tl.full((1, BLOCK), 1.0, tl.float32)
    if HAS_BIAS:
        bias = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        bias = tl.zeros((1, BLOCK), tl.float32)
    dw = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    db = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    dshift = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    dscale = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    for i in range(0, blocks_per_program):
        s = (first + i * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        s_mask = s < n_s
        mask = s_mask[:, None] & col_mask[None, :]
        rows = b * n_s + s
        offs = rows[:, None] * n_cols + cols[None, :]
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(SCALE + (b * stride_mb + s * stride_ms)[:, None] + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=s_mask, other=0.0)[:, None]
        rstd = tl.load(RSTD + rows, mask=s_mask, other=0.0)[:, None]
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        dln = dy * (1.0 + scale)
        dxhat = dln * w
        dx = (dxhat - (tl.sum(dxhat, axis=1) / n_cols)[:, None]
              - xhat * (tl.sum(dxhat * xhat, axis=1) / n_cols)[:, None]) * rstd
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dln * xhat
        db += dln
        if PER_TOKEN:
            tl.store(DSHIFT + offs, dy, mask=mask)
            tl.store(DSCALE + offs, dy * (xhat * w + bias), mask=mask)
        else:
            dshift += dy
            dscale += dy * (xhat * w + bias)
    base = PARTIAL + pid * 4 * n_cols + cols
    tl.store(base, tl.sum(dw, axis=0), mask=col_mask)
    tl.store(base + n_cols, tl.sum(db, axis=0), mask=col_mask)
    tl.store(base + 2 * n_cols, tl.sum(dshift, axis=0), mask=col_mask)
    tl.store(base + 3 * n_cols, tl.sum(dscale, axis=0), mask=col_mask)


def _varies_over_s(mod: torch.Tensor) -> bool:
    """Whether a ``[b, s, d]`` view of a modulation differs along s (a nonzero stride there)."""
    return mod.shape[1] > 1 and mod.stride(1) != 0


class _LayerNormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, eps, weight, bias):
        shape = x.shape
        x3 = x.reshape(-1, shape[-2], shape[-1]).contiguous()
        mods = [m.expand(shape).reshape(x3.shape) for m in (shift, scale)]
        # Both modulations share one layout: per token if either varies over s.
        per_token = _varies_over_s(mods[0]) or _varies_over_s(mods[1])
        if per_token:
            mods = [m.contiguous() for m in mods]
        else:
            mods = [m[:, :1].contiguous().expand(x3.shape) for m in mods]
        shift3, scale3 = mods
        n_b, n_s, n_cols = x3.shape
        y = torch.empty(x3.shape, device=x.device, dtype=x.dtype)
        mean = torch.empty(n_b * n_s, device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        block = block_for(n_cols)
        w = weight if weight is not None else x3
        bb = bias if bias is not None else x3
        per = rows_for(block)
        _forward[(triton.cdiv(n_b * n_s, per),)](x3, w, bb, shift3, scale3, y, mean, rstd, n_b * n_s, n_s, n_cols,
                                                 eps, scale3.stride(0), scale3.stride(1),
                                                 HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, ROWS=per,
                                                 BLOCK=block, num_warps=warps_for(per * block))
        ctx.save_for_backward(x3, weight, bias, scale3, mean, rstd)
        ctx.meta = (shape, shift.shape, scale.shape, shift.dtype, scale.dtype, per_token)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x3, weight, bias, scale3, mean, rstd = ctx.saved_tensors
        shape, shift_shape, scale_shape, shift_dtype, scale_dtype, per_token = ctx.meta
        n_b, n_s, n_cols = x3.shape
        dy3 = dy.reshape(x3.shape).contiguous()
        dx = torch.empty_like(x3)
        block = block_for(n_cols)
        per = rows_for(block, 2048)
        row_blocks = triton.cdiv(n_s, per)  # per sample
        per_b = max(1, programs_for(n_b * row_blocks, x3.device) // n_b)
        blocks_per_program = triton.cdiv(row_blocks, per_b)
        chunks = triton.cdiv(row_blocks, blocks_per_program)
        partial = torch.empty(n_b * chunks, 4, n_cols, device=x3.device, dtype=torch.float32)
        if per_token:
            dshift = torch.empty(x3.shape, device=x3.device, dtype=torch.float32)
            dscale = torch.empty_like(dshift)
        else:
            dshift = dscale = partial  # unused by the kernel
        w = weight if weight is not None else x3
        bb = bias if bias is not None else x3
        _backward[(n_b * chunks,)](dy3, x3, w, bb, scale3, mean, rstd, dx, dshift, dscale, partial, n_s, n_cols,
                                   blocks_per_program, chunks, scale3.stride(0), scale3.stride(1),
                                   HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, PER_TOKEN=per_token,
                                   ROWS=per, BLOCK=block, num_warps=warps_for(per * block))
        sums = partial.view(n_b, chunks, 4, n_cols).sum(1)  # [b, 4, d]
        if not per_token:
            dshift, dscale = sums[:, 2:3], sums[:, 3:4]  # [b, 1, d]
            dshift = dshift.reshape(*shape[:-2], 1, n_cols)
            dscale = dscale.reshape(*shape[:-2], 1, n_cols)
        else:
            dshift, dscale = dshift.view(shape), dscale.view(shape)
        dw = sums[:, 0].sum(0).to(weight.dtype) if weight is not None else None
        db = sums[:, 1].sum(0).to(bias.dtype) if bias is not None else None
        return (dx.view(shape), dshift.sum_to_size(shift_shape).to(shift_dtype),
                dscale.sum_to_size(scale_shape).to(scale_dtype),
                None, dw, db)


def layer_norm_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                        weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``layer_norm(x) * (1 + scale) + shift`` over the last dim.

    Args:
        x: ``[..., s, d]`` activations.
        shift: Broadcastable to ``x`` (``[b, 1, d]`` or ``[b, s, d]``).
        scale: Broadcastable to ``x``, same roles as ``shift``.
        eps: Added to the variance.
        weight: Optional LayerNorm weight ``[d]``.
        bias: Optional LayerNorm bias ``[d]``.

    Returns:
        The modulated activations in ``x``'s dtype.
    """
    if x.dim() < 2:
        raise ValueError(f"layer_norm_modulate expects x [..., s, d], got {tuple(x.shape)}")
    return _LayerNormModulate.apply(x, shift, scale, float(eps), weight, bias)
