"""The ``analytic`` backend of ``rms_norm``: plain torch ops with a hand-derived backward.

Autograd differentiates the reference RMSNorm (``x * rsqrt(mean(x^2) + eps) * w``) node by node:
``pow``, ``mean``, ``rsqrt`` and two ``mul`` backwards, each a pass over the activations, and it
keeps the fp32 input, the normalised input and the product for them. The closed form needs the
input and one ``1 / rms`` per row::

    x_hat = x * rstd
    grad_w = sum_rows(grad * x_hat)
    grad_x = rstd * (grad * w - x_hat * mean(grad * w * x_hat))

Forward outputs are bit-identical to :mod:`loong_core.kernels.reference` (the same ops in the same
order); gradients agree to fp32 rounding (``test_analytic_kernels.py``). Device-neutral: no
compilation and no custom kernel, so ``auto`` picks it on every device where nothing faster is
available (``docs/kernels.md`` has the measurement).
"""

from __future__ import annotations

import torch


def _row_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t [..., d]`` over every dim but the last -> ``[d]``."""
    return t.reshape(-1, t.shape[-1]).sum(0)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        x_hat = x.float() * rstd
        grad_f = grad.float()
        grad_weight = _row_sum(grad_f * x_hat).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_y = grad_f * weight.float()
        dot = (grad_y * x_hat).mean(-1, keepdim=True)
        grad_x = torch.addcmul(grad_y, x_hat, dot, value=-1.0).mul_(rstd)
        return grad_x.to(x.dtype), grad_weight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm with a closed-form backward; signature and semantics of
    :func:`loong_core.kernels.reference.rms_norm`."""
    h = x if residual is None else x + residual
    out = _RMSNorm.apply(h, weight, eps)
    return out if residual is None else (out, h)
