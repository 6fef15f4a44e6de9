"""GR00T N1.5's transformers: the DiT action head and the self-attention stack over the VLM features.

Both are made of one pre-norm block: LayerNorm, attention (biased projections), residual,
LayerNorm, GELU(tanh) MLP four times wider, residual; no gates. In the DiT the first norm is
adaptive (scale and shift from the timestep embedding, no affine weights), the second plain, and
the blocks alternate cross-attention to the VLM features (even) and self-attention over the state,
future and action tokens (odd); an adaptive LayerNorm and a projection close it. The VLM
features pass through plain (affine) blocks first. The layout, names aside, is LeRobot 0.4.4's
GR00T N1.5 action head (``tests/test_lerobot_groot.py`` checks it weight for weight).

GR00T N1.6's DiT (Isaac-GR00T's ``AlternateVLDiT``) is the same stack whose cross-attention
blocks read either the text tokens or the image tokens of the VLM features, never both: with
``attend_text_every=n``, cross block ``i`` reads the text when ``i % (2 n) == 0`` and the images
otherwise (n=2: blocks 0, 4, 8... text; 2, 6, 10... images).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loong_core.kernels import sdpa_precision
from loong_core.kernels.torch_modules import norm_modulate


class Attention(nn.Module):
    """Multi-head attention of ``x`` over ``context`` (itself when None) with a key-validity mask and
    ``dropout`` on the attention probabilities while training."""

    def __init__(self, width: int, num_heads: int, context_dim: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
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
        out = sdpa_precision.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(context)),
                                                          split(self.v_proj(context)), attn_mask=mask,
                                                          dropout_p=self.dropout if self.training else 0.0)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class AdaLayerNorm(nn.Module):
    """LayerNorm without affine weights, scaled and shifted by ``linear(silu(cond))`` (scale first)."""

    def __init__(self, width: int, cond_dim: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=eps, elementwise_affine=False)
        self.linear = nn.Linear(cond_dim, 2 * width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(cond))[:, None].chunk(2, dim=-1)
        return norm_modulate(self.norm, x, shift, scale)


class Block(nn.Module):
    """Pre-norm attention + MLP block; adaptive first norm when ``cond_dim`` is given, cross-attention
    to a context when ``context_dim`` is given.

    ``mlp_ratio`` sets the MLP's width; ``dropout`` (X-VLA's blocks: 0.1) drops attention
    probabilities and the MLP's hidden and output activations while training.
    """

    def __init__(self, width: int, num_heads: int, cond_dim: int | None = None, context_dim: int | None = None,
                 mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.cross = context_dim is not None
        self.dropout = dropout
        affine = cond_dim is None                 # the DiT's norms have no weights of their own
        hidden = int(width * mlp_ratio)
        self.attn_norm = AdaLayerNorm(width, cond_dim) if cond_dim else nn.LayerNorm(width)
        self.attn = Attention(width, num_heads, context_dim, dropout)
        self.mlp_norm = nn.LayerNorm(width, elementwise_affine=affine)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, width))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dropout:
            return self.mlp(x)
        hidden = F.dropout(self.mlp[1](self.mlp[0](x)), self.dropout, self.training)
        return F.dropout(self.mlp[2](hidden), self.dropout, self.training)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None, context: torch.Tensor | None = None,
                context_valid: torch.Tensor | None = None) -> torch.Tensor:
        h = self.attn_norm(x, cond) if cond is not None else self.attn_norm(x)
        x = x + (self.attn(h, context, context_valid) if self.cross else self.attn(h))
        return x + self._mlp(self.mlp_norm(x))


class SelfAttentionStack(nn.Module):
    """``layers`` plain self-attention :class:`Block` (GR00T's ``vl_self_attention``; X-VLA's transformer)."""

    def __init__(self, width: int, layers: int, num_heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, num_heads, mlp_ratio=mlp_ratio, dropout=dropout)
                                    for _ in range(layers))

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, context_valid=valid)
        return x


class DiT(nn.Module):
    """``layers`` time-conditioned :class:`Block` (even: cross-attention, odd: self-attention) and an
    adaptive-LayerNorm output projection."""

    def __init__(self, width: int, layers: int, num_heads: int, context_dim: int, attend_text_every: int = 0):
        super().__init__()
        self.attend_text_every = attend_text_every
        self.blocks = nn.ModuleList(Block(width, num_heads, width, context_dim if i % 2 == 0 else None)
                                    for i in range(layers))
        self.out_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.out_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.proj_out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, context: torch.Tensor,
                context_valid: torch.Tensor, image: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, T, width]`` conditioned on ``cond [B, width]`` and ``context [B, L, context_dim]``
        (valid where ``context_valid [B, L]``); ``image [B, L]`` marks the image tokens (needed
        with ``attend_text_every``)."""
        reads = [context_valid] * len(self.blocks)
        if self.attend_text_every:
            if image is None:
                raise ValueError("a DiT with attend_text_every needs the image-token mask of its context")
            text_valid, image_valid = context_valid & ~image, context_valid & image
            period = 2 * self.attend_text_every
            reads = [text_valid if i % period == 0 else image_valid for i in range(len(self.blocks))]
        for block, valid in zip(self.blocks, reads):
            x = block(x, cond, context, valid) if block.cross else block(x, cond)
        shift, scale = self.out_modulation(cond)[:, None].chunk(2, dim=-1)
        return self.proj_out(norm_modulate(self.out_norm, x, shift, scale))
