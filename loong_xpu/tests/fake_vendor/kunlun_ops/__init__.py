"""Fake ``kunlun_ops`` (tests only): ``rmsnorm(x, weight, eps, out=...)``, forward only."""

from __future__ import annotations

import torch

CALLS = {"rmsnorm": 0}


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """``out = x / sqrt(mean(x^2) + eps) * weight`` over the last dim, in fp32."""
    assert not torch.is_grad_enabled() or not x.requires_grad, "the vendor op has no autograd"
    CALLS["rmsnorm"] += 1
    h = x.float()
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_(y.to(out.dtype))
