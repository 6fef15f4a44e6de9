"""The DiT action head: blocks with AdaLN-zero time conditioning, alternating cross- and self-attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loong_core.kernels.torch_modules import norm_modulate
from loong_embodied.policies.common.conditioning import AdaLayerNormZero


class Attention(nn.Module):
    """Multi-head attention of ``x`` over ``context`` (itself when None) with a key-validity mask."""

    def __init__(self, width: int, num_heads: int, context_dim: int | None = None):
        super().__init__()
        self.num_heads = num_heads
        context_dim = context_dim or width
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(context_dim, width)
        self.v_proj = nn.Linear(context_dim, width)
        self.o_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                context_valid: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        b, heads = x.shape[0], self.num_heads

        def split(y):
            return y.view(b, y.shape[1], heads, -1).transpose(1, 2)

        mask = context_valid[:, None, None, :] if context_valid is not None else None
        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(context)),
                                             split(self.v_proj(context)), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DiTBlock(nn.Module):
    """AdaLN-zero attention (cross to the VLM features, or self) then AdaLN-zero MLP, gated residuals."""

    def __init__(self, width: int, num_heads: int, cond_dim: int, context_dim: int | None):
        super().__init__()
        self.cross = context_dim is not None
        self.attn_norm = AdaLayerNormZero(width, cond_dim)
        self.attn = Attention(width, num_heads, context_dim)
        self.mlp_norm = AdaLayerNormZero(width, cond_dim)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, context: torch.Tensor,
                context_valid: torch.Tensor) -> torch.Tensor:
        h, gate = self.attn_norm(x, cond)
        x = x + gate * (self.attn(h, context, context_valid) if self.cross else self.attn(h))
        h, gate = self.mlp_norm(x, cond)
        return x + gate * self.mlp(h)


class DiT(nn.Module):
    """``layers`` :class:`DiTBlock` (even: cross-attention, odd: self-attention) and an AdaLN output layer."""

    def __init__(self, width: int, layers: int, num_heads: int, context_dim: int):
        super().__init__()
        self.blocks = nn.ModuleList(DiTBlock(width, num_heads, width, context_dim if i % 2 == 0 else None)
                                    for i in range(layers))
        self.out_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.out_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.proj_out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, context: torch.Tensor,
                context_valid: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, cond, context, context_valid)
        shift, scale = self.out_modulation(cond)[:, None].chunk(2, dim=-1)
        return self.proj_out(norm_modulate(self.out_norm, x, shift, scale))
