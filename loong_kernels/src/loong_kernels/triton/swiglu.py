"""SwiGLU in Triton: ``silu(x[..., :F]) * x[..., F:]`` of a fused gate/up projection, forward and backward.

The product is computed in fp32 and rounded once to the input dtype. The kernels are elementwise
over the ``rows x F`` outputs in flat blocks, so narrow rows still fill a program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import as_rows

_BLOCK = 2048


@triton.jit
def _forward(X, Y, stride_x, n_out, n_cols, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_out
    row, col = i // n_cols, i % n_cols
    gate = tl.load(X + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + i, (gate * tl.sigmoid(gate) * up).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, DX, stride_x, n_out, n_cols, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_out
    row, col = i // n_cols, i % n_cols
    dy = tl.load(DY + i, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(X + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + col, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    out = DX + row * (2 * n_cols) + col
    tl.store(out, dgate.to(DX.dtype.element_ty), mask=mask)
    tl.store(out + n_cols, (dy * gate * sig).to(DX.dtype.element_ty), mask=mask)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.shape[-1] % 2:
            raise ValueError(f"swiglu needs an even last dim (gate and up halves), got {x.shape[-1]}")
        rows = as_rows(x)
        n_cols = rows.shape[1] // 2
        y = torch.empty(rows.shape[0], n_cols, device=x.device, dtype=x.dtype)
        _forward[(triton.cdiv(y.numel(), _BLOCK),)](rows, y, rows.stride(0), y.numel(), n_cols, BLOCK=_BLOCK,
                                                    num_warps=4)
        ctx.save_for_backward(rows)
        ctx.shape = x.shape
        return y.view(*x.shape[:-1], n_cols)

    @staticmethod
    def backward(ctx, dy):
        (rows,) = ctx.saved_tensors
        dy = dy.contiguous()
        n_cols = rows.shape[1] // 2
        dx = torch.empty(rows.shape, device=rows.device, dtype=rows.dtype)
        _backward[(triton.cdiv(dy.numel(), _BLOCK),)](dy, rows, dx, rows.stride(0), dy.numel(), n_cols,
                                                      BLOCK=_BLOCK, num_warps=4)
        return dx.view(ctx.shape)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate, up = x.chunk(2, dim=-1)``.

    Args:
        x: megatron-core's gated fc1 output ``[..., 2F]``.

    Returns:
        ``[..., F]`` in ``x``'s dtype.
    """
    return _SwiGLU.apply(x)
