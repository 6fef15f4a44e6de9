"""Shared launch helpers of the Triton kernels: block sizes, warps, program counts, row views."""

from __future__ import annotations

import torch
import triton

# Programs of the row-looping backward kernels off CUDA (Triton's interpreter): few, so each
# loops over several rows as on a GPU and the weight-gradient partials stay small.
_CPU_PROGRAMS = 4


def block_for(n: int) -> int:
    """The power-of-two block covering ``n`` columns (at least 16, what ``tl.arange`` accepts)."""
    return max(16, triton.next_power_of_2(n))


def rows_for(block: int, elements: int = 4096) -> int:
    """Rows per program of a row-wise kernel: a ``[rows, block]`` tile of about ``elements``."""
    return max(1, min(64, elements // block))


def warps_for(block: int) -> int:
    """Warps for a one-row tile of ``block`` elements: more warps for longer rows."""
    return min(16, max(1, block // 512))


def programs_for(rows: int, device: torch.device) -> int:
    """Programs of a row-looping backward kernel: a few per SM on CUDA, bounded everywhere."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(rows, 4 * sms))
    return max(1, min(rows, _CPU_PROGRAMS))


def tile_for(device: torch.device, gpu: int = 64, interpreter: int = 16) -> int:
    """Side of a square 2-D tile: ``gpu`` on CUDA, a small one in Triton's interpreter (CPU)."""
    return gpu if device.type == "cuda" else interpreter


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed as ``[rows, last dim]`` with a unit stride in the last dim (copies only if needed)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows
