"""Time-conditioned normalisation: adaptive RMSNorm (Pi0.5); GR00T's adaptive LayerNorm is in ``groot.dit``."""

from __future__ import annotations

import torch
from torch import nn


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
