"""Fake ``torch_xmlir.nn.swiglu``: ``SwiGLUFunction.apply(x)`` on ``[N, 2F]`` -> ``[N, F]``."""

from __future__ import annotations

import torch


class SwiGLUFunction(torch.autograd.Function):
    """``silu(x[:, :F]) * x[:, F:]`` with its own backward."""

    @staticmethod
    def forward(ctx, x):
        assert x.dim() == 2, "the vendor op takes a 2-D input"
        ctx.save_for_backward(x)
        gate, up = x.float().chunk(2, dim=-1)
        return (gate * torch.sigmoid(gate) * up).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        gate, up = x.float().chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        g = grad.float()
        d_gate = g * up * sig * (1 + gate * (1 - sig))
        d_up = g * gate * sig
        return torch.cat((d_gate, d_up), dim=-1).to(x.dtype)
