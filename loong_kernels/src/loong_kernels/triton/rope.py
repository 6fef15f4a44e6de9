"""Rotary position embedding in Triton (megatron-core layout, rotate-half), forward and backward.

``rope(t, freqs)``: ``t`` is ``[s, b, h, d]`` (any strides with a unit last stride), ``freqs`` the fp32
angles ``[s, b or 1, 1, d_rot]``. The first ``d_rot`` channels are rotated
(``t * cos + rotate_half(t) * sin``), the rest pass through. Both halves of ``freqs`` are read, so
every layout works unchanged: standard, llama3-scaled, and the Qwen2.5-VL / Qwen3-VL MRoPE ones.
``freqs`` gets no gradient (megatron-core's angles never require one).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_kernels.triton._launch import block_for, rows_for


@triton.jit
def _rotate(T, F, OUT, n_pos, n_b, n_h, half, d_pass, stride_ts, stride_tb, stride_th, stride_fs, stride_fb,
            INVERSE: tl.constexpr, POS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
            BLOCK_PASS: tl.constexpr):
    # A program takes POS (position, sample) pairs x every head: cos / sin once per pair, reused by
    # its heads. The output is contiguous [s, b, h, d].
    pos = (tl.program_id(0) * POS + tl.arange(0, POS)).to(tl.int64)
    s = (pos // n_b)[:, None, None]
    b = (pos % n_b)[:, None, None]
    pos_mask = (pos < n_pos)[:, None, None]
    h = tl.arange(0, BLOCK_H)[None, :, None]
    k = tl.arange(0, BLOCK_HALF)[None, None, :]
    f_mask = pos_mask & (k < half)
    mask = f_mask & (h < n_h)
    f_row = F + s * stride_fs + b * stride_fb
    f1 = tl.load(f_row + k, mask=f_mask, other=0.0).to(tl.float32)
    f2 = tl.load(f_row + half + k, mask=f_mask, other=0.0).to(tl.float32)
    cos1, sin1, cos2, sin2 = tl.cos(f1), tl.sin(f1), tl.cos(f2), tl.sin(f2)
    t_row = T + s * stride_ts + b * stride_tb + h * stride_th
    o_row = OUT + (pos[:, None, None] * n_h + h) * (2 * half + d_pass)
    x1 = tl.load(t_row + k, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(t_row + half + k, mask=mask, other=0.0).to(tl.float32)
    if INVERSE:  # the transpose of the rotation: the gradient
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    tl.store(o_row + k, y1.to(OUT.dtype.element_ty), mask=mask)
    tl.store(o_row + half + k, y2.to(OUT.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:
        p = tl.arange(0, BLOCK_PASS)[None, None, :]
        p_mask = pos_mask & (h < n_h) & (p < d_pass)
        rest = tl.load(t_row + 2 * half + p, mask=p_mask, other=0.0)
        tl.store(o_row + 2 * half + p, rest, mask=p_mask)


def _apply(t: torch.Tensor, freqs: torch.Tensor, inverse: bool) -> torch.Tensor:
    if t.stride(-1) != 1:
        t = t.contiguous()
    n_s, n_b, n_h, d = t.shape
    d_rot = freqs.shape[-1]
    if d_rot % 2 or d_rot > d:
        raise ValueError(f"rope: freqs' last dim {d_rot} must be even and at most the head dim {d}")
    if freqs.stride(-1) != 1:
        freqs = freqs.contiguous()
    out = torch.empty(t.shape, device=t.device, dtype=t.dtype)
    half, d_pass = d_rot // 2, d - d_rot
    stride_fb = freqs.stride(1) if freqs.shape[1] > 1 else 0
    block_h, block_half = triton.next_power_of_2(n_h), block_for(half)
    block_pass = block_for(d_pass) if d_pass else 0
    per = rows_for(block_h * block_half, 2048)
    n_pos = n_s * n_b
    _rotate[(triton.cdiv(n_pos, per),)](t, freqs, out, n_pos, n_b, n_h, half, d_pass, t.stride(0), t.stride(1),
                                        t.stride(2), freqs.stride(0), stride_fb, INVERSE=inverse, POS=per,
                                        BLOCK_H=block_h, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
                                        num_warps=4)
    return out


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, freqs):
        ctx.save_for_backward(freqs)
        return _apply(t, freqs, inverse=False)

    @staticmethod
    def backward(ctx, dy):
        (freqs,) = ctx.saved_tensors
        return _apply(dy, freqs, inverse=True), None


def rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``freqs.shape[-1]`` channels of ``t`` by the angles ``freqs``.

    Args:
        t: ``[s, b, h, d]`` queries or keys.
        freqs: fp32 angles ``[s, b or 1, 1, d_rot]``.

    Returns:
        A new ``[s, b, h, d]`` tensor in ``t``'s dtype.
    """
    if t.dim() != 4 or freqs.dim() != 4:
        raise ValueError(f"rope expects t [s, b, h, d] and freqs [s, b, 1, d_rot], got {tuple(t.shape)} and "
                         f"{tuple(freqs.shape)}")
    return _RoPE.apply(t, freqs)
