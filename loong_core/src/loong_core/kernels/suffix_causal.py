"""Causal attention of a query block that ends the key sequence, without a dense mask (CPU).

Under context parallelism a query chunk ``[jc, (j + 1) c)`` attends to the key prefix
``[0, (j + 1) c)`` with the causal diagonal bottom-right aligned (``sq < sk``). SDPA's
``is_causal`` is top-left aligned, so that pattern needed a dense ``[sq, sk]`` mask, which the CPU
flash kernel turns into a float bias: ``O(sq x sk)`` memory per call, so memory per token grew
with the sequence. Here the keys are split in two parts whose masks SDPA knows:

- the ``sk - sq`` keys before the block, which every query sees (no mask), and
- the last ``sq`` keys, a square causal block (``is_causal``, top-left = bottom-right).

Both run through the CPU flash kernel, which also returns each row's log-sum-exp; the two partial
outputs are merged with their log-sum-exps. The backward runs the flash backward of each part
with the *merged* output and log-sum-exp (the softmax of the whole row), so each part yields
exactly its share of dQ and its own dK / dV. Memory is ``O(s)``: no score or mask matrix exists.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def applies(q: torch.Tensor, k: torch.Tensor, causal: bool, mask, segment_ids,
            dropout_p: float) -> bool:
    """Whether :func:`attention` serves this call: causal, fewer queries than keys, no mask, no
    dropout, on CPU."""
    return (causal and mask is None and segment_ids is None and dropout_p == 0.0
            and q.device.type == "cpu" and q.shape[2] < k.shape[2])


class SuffixCausalAttention(torch.autograd.Function):
    """``q [b, h, sq, d]`` against ``k, v [b, g, sk, d]`` (``g`` divides ``h``), causal with the
    diagonal bottom-right aligned."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        prefix = k.shape[2] - q.shape[2]
        out_p, lse_p = _FORWARD(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False, scale=scale)
        out_d, lse_d = _FORWARD(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True, scale=scale)
        lse = torch.logaddexp(lse_p, lse_d)
        weight_p = torch.exp(lse_p - lse).unsqueeze(-1)
        acc = torch.promote_types(q.dtype, torch.float32)  # merge in fp32 (fp64 stays fp64)
        out = (out_p.to(acc) * weight_p + out_d.to(acc) * (1.0 - weight_p)).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        prefix = k.shape[2] - q.shape[2]
        grad_out = grad_out.contiguous()
        dq_p, dk_p, dv_p = _BACKWARD(grad_out, q, k[:, :, :prefix], v[:, :, :prefix], out, lse,
                                     0.0, False, scale=ctx.scale)
        dq_d, dk_d, dv_d = _BACKWARD(grad_out, q, k[:, :, prefix:], v[:, :, prefix:], out, lse,
                                     0.0, True, scale=ctx.scale)
        return dq_p + dq_d, torch.cat([dk_p, dk_d], dim=2), torch.cat([dv_p, dv_d], dim=2), None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None) -> torch.Tensor:
    """Bottom-right causal attention of ``q [b, h, sq, d]`` over ``k [b, g, sk, d]`` and
    ``v [b, g, sk, dv]``, ``sq < sk`` (see the module docstring); ``g`` must divide ``h``
    (grouped-query attention). The flash kernel needs one head size, so a smaller ``dv`` (MLA)
    is zero-padded, and a larger one zero-pads ``q`` and ``k`` (scores are unchanged)."""
    d, dv = q.shape[-1], v.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    if dv < d:
        return SuffixCausalAttention.apply(q, k, F.pad(v, (0, d - dv)), scale)[..., :dv]
    if dv > d:
        q, k = F.pad(q, (0, dv - d)), F.pad(k, (0, dv - d))
    return SuffixCausalAttention.apply(q, k, v, scale)
