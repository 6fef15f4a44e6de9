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

from loong_kernels.triton._launch import block_for, programs_for, warps_for


@triton.jit
def _forward(X, W, B, SHIFT, SCALE, Y, MEAN, RSTD, n_s, n_cols, eps, stride_xb, stride_xs,
             stride_mb, stride_ms, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // n_s).to(tl.int64)
    s = (pid % n_s).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + b * stride_xb + s * stride_xs + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    rstd = tl.math.rsqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
    y = centred * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    mod = b * stride_mb + s * stride_ms + cols
    scale = tl.load(SCALE + mod, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(SHIFT + mod, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + b * stride_xb + s * stride_xs + cols, (y * (1.0 + scale) + shift).to(Y.dtype.element_ty),
             mask=mask)
    tl.store(MEAN + pid, mean)
    tl.store(RSTD + pid, rstd)


@triton.jit
def _backward(DY, X, W, B, SCALE, MEAN, RSTD, DX, DSHIFT, DSCALE, PARTIAL, n_s, n_cols, rows_per_program,
              chunks_per_b, stride_xb, stride_xs, stride_mb, stride_ms, HAS_WEIGHT: tl.constexpr,
              HAS_BIAS: tl.constexpr, PER_TOKEN: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // chunks_per_b).to(tl.int64)
    start = (pid % chunks_per_b) * rows_per_program
    end = tl.minimum(start + rows_per_program, n_s)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) if HAS_WEIGHT else tl.full((BLOCK,), 1.0, tl.float32)
    bias = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32) if HAS_BIAS else tl.zeros((BLOCK,), tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    dshift = tl.zeros((BLOCK,), dtype=tl.float32)
    dscale = tl.zeros((BLOCK,), dtype=tl.float32)
    for s_ in range(start, end):
        s = tl.cast(s_, tl.int64)
        row = b * n_s + s
        offs = b * stride_xb + s * stride_xs + cols
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        mod = b * stride_mb + s * stride_ms + cols
        scale = tl.load(SCALE + mod, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - tl.load(MEAN + row)) * tl.load(RSTD + row), 0.0)
        dln = dy * (1.0 + scale)
        dxhat = dln * w
        dx = (dxhat - tl.sum(dxhat, axis=0) / n_cols - xhat * (tl.sum(dxhat * xhat, axis=0) / n_cols)) \
            * tl.load(RSTD + row)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dln * xhat
        db += dln
        if PER_TOKEN:
            tl.store(DSHIFT + row * n_cols + cols, dy, mask=mask)
            tl.store(DSCALE + row * n_cols + cols, dy * (xhat * w + bias), mask=mask)
        else:
            dshift += dy
            dscale += dy * (xhat * w + bias)
    base = PARTIAL + pid * 4 * n_cols + cols
    tl.store(base, dw, mask=mask)
    tl.store(base + n_cols, db, mask=mask)
    tl.store(base + 2 * n_cols, dshift, mask=mask)
    tl.store(base + 3 * n_cols, dscale, mask=mask)


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
        _forward[(n_b * n_s,)](x3, w, bb, shift3, scale3, y, mean, rstd, n_s, n_cols, eps, x3.stride(0),
                               x3.stride(1), scale3.stride(0), scale3.stride(1), HAS_WEIGHT=weight is not None,
                               HAS_BIAS=bias is not None, BLOCK=block, num_warps=warps_for(block))
        ctx.save_for_backward(x3, weight, bias, scale3, mean, rstd)
        ctx.meta = (shape, shift.shape, scale.shape, per_token, eps)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x3, weight, bias, scale3, mean, rstd = ctx.saved_tensors
        shape, shift_shape, scale_shape, per_token, _ = ctx.meta
        n_b, n_s, n_cols = x3.shape
        dy3 = dy.reshape(x3.shape).contiguous()
        dx = torch.empty_like(x3)
        per_b = max(1, programs_for(n_b * n_s, x3.device) // n_b)
        rows_per_program = triton.cdiv(n_s, per_b)
        chunks = triton.cdiv(n_s, rows_per_program)
        partial = torch.empty(n_b * chunks, 4, n_cols, device=x3.device, dtype=torch.float32)
        if per_token:
            dshift = torch.empty(x3.shape, device=x3.device, dtype=torch.float32)
            dscale = torch.empty_like(dshift)
        else:
            dshift = dscale = partial  # unused by the kernel
        block = block_for(n_cols)
        w = weight if weight is not None else x3
        bb = bias if bias is not None else x3
        _backward[(n_b * chunks,)](dy3, x3, w, bb, scale3, mean, rstd, dx, dshift, dscale, partial, n_s, n_cols,
                                   rows_per_program, chunks, x3.stride(0), x3.stride(1), scale3.stride(0),
                                   scale3.stride(1), HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                                   PER_TOKEN=per_token, BLOCK=block, num_warps=warps_for(block))
        sums = partial.view(n_b, chunks, 4, n_cols).sum(1)  # [b, 4, d]
        if not per_token:
            dshift, dscale = sums[:, 2:3], sums[:, 3:4]  # [b, 1, d]
            dshift = dshift.reshape(*shape[:-2], 1, n_cols)
            dscale = dscale.reshape(*shape[:-2], 1, n_cols)
        else:
            dshift, dscale = dshift.view(shape), dscale.view(shape)
        dtype = dy.dtype
        dw = sums[:, 0].sum(0).to(weight.dtype) if weight is not None else None
        db = sums[:, 1].sum(0).to(bias.dtype) if bias is not None else None
        return (dx.view(shape), dshift.sum_to_size(shift_shape).to(dtype), dscale.sum_to_size(scale_shape).to(dtype),
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
