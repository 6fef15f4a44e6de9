"""SwiGLU in Triton: ``silu(x[..., :F]) * x[..., F:]`` of a fused gate/up projection, forward and backward.

The product is computed in fp32 and rounded once to the input dtype. Each program takes a
``[ROWS, BLOCK]`` tile of the ``rows x F`` outputs (several rows when F is narrow), so no
per-element index division is needed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import as_rows, block_for, rows_for

_BLOCK = 1024


@triton.jit
def _forward(X, Y, stride_x, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    gate = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + rows * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows * n_cols + cols, (gate * tl.sigmoid(gate) * up).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(DY, X, DX, stride_x, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    dy = tl.load(DY + rows * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + rows * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    out = DX + rows * (2 * n_cols) + cols
    tl.store(out, dgate.to(DX.dtype.element_ty), mask=mask)
    tl.store(out + n_cols, (dy * gate * sig).to(DX.dtype.element_ty), mask=mask)


def _grid(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int, int]:
    block = min(_BLOCK, block_for(n_cols))
    rows = rows_for(block, 2048)
    return (triton.cdiv(n_rows, rows), triton.cdiv(n_cols, block)), rows, block


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.shape[-1] % 2:
            raise ValueError(f"swiglu needs an even last dim (gate and up halves), got {x.shape[-1]}")
        rows = as_rows(x)
        n_rows, n_cols = rows.shape[0], rows.shape[1] // 2
        y = torch.empty(n_rows, n_cols, device=x.device, dtype=x.dtype)
        grid, per, block = _grid(n_rows, n_cols)
        _forward[grid](rows, y, rows.stride(0), n_rows, n_cols, ROWS=per, BLOCK=block, num_warps=4)
        ctx.save_for_backward(rows)
        ctx.shape = x.shape
        return y.view(*x.shape[:-1], n_cols)

    @staticmethod
    def backward(ctx, dy):
        (rows,) = ctx.saved_tensors
        dy = dy.contiguous()
        n_rows, n_cols = rows.shape[0], rows.shape[1] // 2
        dx = torch.empty(rows.shape, device=rows.device, dtype=rows.dtype)
        grid, per, block = _grid(n_rows, n_cols)
        _backward[grid](dy, rows, dx, rows.stride(0), n_rows, n_cols, ROWS=per, BLOCK=block, num_warps=4)
        return dx.view(ctx.shape)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate, up = x.chunk(2, dim=-1)``.

    Args:
        x: megatron-core's gated fc1 output ``[..., 2F]``.

    Returns:
        ``[..., F]`` in ``x``'s dtype.
    """
    return _SwiGLU.apply(x)
