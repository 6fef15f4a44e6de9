"""Time-conditioned normalisation layers: adaptive RMSNorm (Pi0.5) and adaptive LayerNorm (DiT)."""

from __future__ import annotations

import torch
from torch import nn

from loong_core.kernels.torch_modules import norm_modulate


class AdaRMSNorm(nn.Module):
    """RMSNorm whose scale and shift come from a condition, plus a gate for the residual branch.

    The modulation is zero-initialised: at init the norm is a plain RMSNorm and the gated branch
    adds nothing (the block starts as the identity).
    """

    def __init__(self, width: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.modulation = nn.Linear(cond_dim, 3 * width)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(normalised x, gate)`` for ``x`` ``[B, L, W]`` and a condition ``[B, cond_dim]``."""
        scale, shift, gate = self.modulation(cond)[:, None].chunk(3, dim=-1)
        normed = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
        return normed * (1.0 + scale) + shift, gate


class AdaLayerNormZero(nn.Module):
    """LayerNorm (no affine) modulated by a condition: shift, scale and a zero-initialised gate."""

    def __init__(self, width: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=eps)
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim, 3 * width))
        nn.init.zeros_(self.modulation[1].weight)
        nn.init.zeros_(self.modulation[1].bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(modulated norm of x, gate)`` for ``x`` ``[B, L, W]`` and a condition ``[B, cond_dim]``."""
        shift, scale, gate = self.modulation(cond)[:, None].chunk(3, dim=-1)
        return norm_modulate(self.norm, x, shift, scale), gate
