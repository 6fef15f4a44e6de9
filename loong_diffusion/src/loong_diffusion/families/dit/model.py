"""The small DiT: patch embedding, adaLN-Zero transformer blocks conditioned on (timestep, class)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from loong_core.engines.torch_native import ulysses
from loong_core.kernels import sdpa_precision
from loong_core.kernels.torch_modules import norm_modulate
from loong_diffusion.families.dit.config import DiTConfig
from loong_diffusion.provider import DiffusionProvider


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` of timesteps ``t`` in [0, 1000]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(norm: nn.LayerNorm, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN ``norm(x) * (1 + scale) + shift`` for per-sample ``shift`` / ``scale`` ``[B, h]``
    (fused as ``kernels.layer_norm_modulate`` when that op is not plain)."""
    return norm_modulate(norm, x, shift[:, None], scale[:, None])


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> tokens ``[B, (H/p)(W/p), C*p*p]`` (row-major patches; the inverse of
    the unpatchify at the end of :meth:`DiT.forward`)."""
    b, ch, h, w = x.shape
    return x.view(b, ch, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), ch * p * p)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention in ``[b, s, h, d]`` layout: bidirectional, or limited by a boolean ``mask``
    ``[s, s]`` (True: the query row may attend to the key column)."""
    out = sdpa_precision.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      attn_mask=mask)
    return out.transpose(1, 2)


class DiTBlock(nn.Module):
    """Pre-norm attention + MLP whose norms are modulated, and outputs gated, by the condition."""

    def __init__(self, c: DiTConfig):
        super().__init__()
        h = c.hidden_size
        self.heads = c.num_attention_heads
        self.norm1 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        inner = int(h * c.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(h, inner), nn.GELU(approximate="tanh"), nn.Linear(inner, h))
        self.ada = nn.Linear(h, 6 * h)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, N, h]`` tokens, ``cond [B, h]``; ``mask [N, N]`` (True: may attend) or None (all)."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(cond)).chunk(6, dim=-1)
        b, n, h = x.shape
        q, k, v = self.qkv(modulate(self.norm1, x, shift1, scale1)).view(b, n, 3, self.heads, -1).unbind(2)
        if mask is None:
            attn = ulysses.attention(q, k, v, _attend)  # all-to-all over tokens <-> heads under Ulysses
        else:
            if ulysses.size() > 1:
                raise ValueError("an attention mask is not supported under Ulysses sequence parallelism")
            attn = _attend(q, k, v, mask)
        x = x + gate1[:, None] * self.proj(attn.reshape(b, n, h))
        return x + gate2[:, None] * self.mlp(modulate(self.norm2, x, shift2, scale2))



def init_adaln_zero(model: nn.Module, blocks, embeddings, zero_layers) -> None:
    """The DiT initialisation: Xavier-uniform linears with zero biases, ``N(0, 0.02)`` embeddings
    and positions, zero adaLN weights in every block and zero ``zero_layers`` (the final adaLN and
    output projections), so every block starts as the identity and the output at zero.

    Args:
        model: Module whose ``nn.Linear`` layers are initialised.
        blocks: :class:`DiTBlock` s.
        embeddings: Position and embedding tensors drawn from ``N(0, 0.02)``.
        zero_layers: Linear layers whose weights start at zero.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    for tensor in embeddings:
        nn.init.normal_(tensor, std=0.02)
    for block in blocks:
        nn.init.zeros_(block.ada.weight)
    for layer in zero_layers:
        nn.init.zeros_(layer.weight)

class DiT(nn.Module):
    """Class-conditional DiT predicting the flow-matching velocity of an image."""

    def __init__(self, c: DiTConfig):
        super().__init__()
        self.c = c
        h, p = c.hidden_size, c.patch_size
        self.grid = c.image_size // p
        self.patch = nn.Linear(c.in_channels * p * p, h)
        self.pos = nn.Parameter(torch.zeros(1, self.grid * self.grid, h))
        self.time = nn.Sequential(nn.Linear(c.frequency_dim, h), nn.SiLU(), nn.Linear(h, h))
        self.label = nn.Embedding(c.num_classes + 1, h)
        self.blocks = nn.ModuleList(DiTBlock(c) for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Linear(h, 2 * h)
        self.out = nn.Linear(h, c.in_channels * p * p)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier linears, zero adaLN and output layers (every block starts as the identity)."""
        init_adaln_zero(self, self.blocks, [self.pos, self.label.weight], [self.ada, self.out])

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, class_label: torch.Tensor) -> torch.Tensor:
        """``x [B, C, H, W]``, ``timestep [B]`` in [0, 1000], ``class_label [B]`` -> velocity like ``x``."""
        b, ch, _, _ = x.shape
        p, g = self.c.patch_size, self.grid
        h = ulysses.shard(self.patch(patchify(x, p)) + self.pos, dim=1)  # this rank's tokens under Ulysses
        cond = self.time(timestep_embedding(timestep, self.c.frequency_dim)) + self.label(class_label)
        for block in self.blocks:
            h = block(h, cond)
        shift, scale = self.ada(F.silu(cond)).chunk(2, dim=-1)
        # Under Ulysses: this rank's tokens, zeros at the others' (its loss covers its own tokens).
        out = ulysses.pad(self.out(modulate(self.norm, h, shift, scale)), dim=1)
        return out.view(b, g, g, ch, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, g * p, g * p)


class DiTProvider(DiffusionProvider):
    """Builds the small DiT for the torch engine."""

    config: DiTConfig

    def build_torch_model(self) -> nn.Module:
        return DiT(self.config)

    def torch_blocks(self, model) -> list:
        return list(model.blocks)

    def enable_ulysses(self, model) -> None:
        """Nothing to install: :class:`DiT` shards its tokens, runs its attention through
        ``ulysses.attention`` and zero-pads its output tokens whenever a Ulysses group is set."""

    def tokens(self, latents):
        return patchify(latents, self.config.patch_size)

    def denoise(self, model, x_t, sigmas, condition):
        return model(x_t, sigmas * 1000.0, condition["class_label"])

    def null_condition(self, condition: dict) -> dict:
        return {"class_label": torch.full_like(condition["class_label"], self.config.num_classes)}

    def latent_tokens(self, latents) -> int:
        return (self.config.image_size // self.config.patch_size) ** 2

    def flops_per_token(self, seq_length: int) -> float:
        """Training FLOPs per sample: 6 x block parameters x tokens + attention."""
        c = self.config
        h, n = c.hidden_size, self.latent_tokens(None)
        per_layer = 4 * h * h + 2 * h * int(h * c.mlp_ratio)
        return 6.0 * n * (c.num_layers * per_layer) + 12.0 * c.num_layers * n * n * h
