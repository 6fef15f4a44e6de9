"""SwiGLU in Triton: ``silu(x[..., :F]) * x[..., F:]`` of a fused gate/up projection, forward and backward.

The product is computed in fp32 and rounded once to the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import as_rows

_BLOCK = 1024


@triton.jit
def _forward(X, Y, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, DX, stride_dy, stride_x, stride_dx, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    tl.store(DX + row * stride_dx + cols, dgate.to(DX.dtype.element_ty), mask=mask)
    tl.store(DX + row * stride_dx + n_cols + cols, (dy * silu).to(DX.dtype.element_ty), mask=mask)


def _grid(rows: int, n_cols: int, block: int) -> tuple[int, int]:
    return rows, triton.cdiv(n_cols, block)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.shape[-1] % 2:
            raise ValueError(f"swiglu needs an even last dim (gate and up halves), got {x.shape[-1]}")
        rows = as_rows(x)
        n_cols = rows.shape[1] // 2
        y = torch.empty(rows.shape[0], n_cols, device=x.device, dtype=x.dtype)
        block = min(_BLOCK, triton.next_power_of_2(max(n_cols, 16)))
        _forward[_grid(rows.shape[0], n_cols, block)](rows, y, rows.stride(0), y.stride(0), n_cols, BLOCK=block,
                                                      num_warps=4)
        ctx.save_for_backward(rows)
        ctx.shape = x.shape
        return y.view(*x.shape[:-1], n_cols)

    @staticmethod
    def backward(ctx, dy):
        (rows,) = ctx.saved_tensors
        dy = as_rows(dy)
        n_cols = rows.shape[1] // 2
        dx = torch.empty_like(rows)
        block = min(_BLOCK, triton.next_power_of_2(max(n_cols, 16)))
        _backward[_grid(rows.shape[0], n_cols, block)](dy, rows, dx, dy.stride(0), rows.stride(0), dx.stride(0),
                                                       n_cols, BLOCK=block, num_warps=4)
        return dx.view(ctx.shape)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate, up = x.chunk(2, dim=-1)``.

    Args:
        x: megatron-core's gated fc1 output ``[..., 2F]``.

    Returns:
        ``[..., F]`` in ``x``'s dtype.
    """
    return _SwiGLU.apply(x)
