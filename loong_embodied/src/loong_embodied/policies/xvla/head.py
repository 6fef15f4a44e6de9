"""X-VLA's soft-prompted transformer: the action head that reads the VLM features.

Each noisy action of the chunk, the (padded) state and the flow-time embedding are concatenated
and encoded by a per-domain linear layer into one token per action; the VLM tokens and the tokens
of the other camera views are projected to the head's width and follow them; learned positions
are added, and the domain's soft prompts are appended. Plain pre-norm blocks (bidirectional, no
mask: every token sees every other) run over the sequence; the action tokens are LayerNorm-ed and
decoded by a per-domain linear layer into the predicted actions (not a velocity). The layout,
names aside, is LeRobot 0.4.4's ``SoftPromptedTransformer`` (``tests/test_lerobot_xvla.py``
checks it weight for weight).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from loong_embodied.policies.common.embodiment import EmbodimentGroups
from loong_embodied.policies.groot.dit import SelfAttentionStack


def time_embedding(t: torch.Tensor, dim: int, max_period: float = 100.0) -> torch.Tensor:
    """``[cos, sin]`` embedding ``[B, dim]`` of flow times ``t`` ``[B]`` in [0, 1] (unscaled), periods
    ``2 pi`` to ``2 pi * max_period``; an odd ``dim`` ends with a zero."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=t.dtype, device=t.device) / half)
    angles = t[:, None] * freqs[None]
    out = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return torch.cat([out, out.new_zeros(out.shape[0], dim % 2)], dim=-1)


class DomainLinear(nn.Module):
    """A linear layer with one weight ``[in, out]`` and bias per domain, chosen per sample (X-VLA's
    layout; the products: :class:`~loong_embodied.policies.common.embodiment.EmbodimentGroups`)."""

    def __init__(self, in_features: int, out_features: int, num_domains: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_domains, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(num_domains, out_features))
        for w in self.weight.data:
            nn.init.xavier_uniform_(w)

    def forward(self, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        """``x`` ``[B, L, in]``, in ``groups.sort``'s order, through each sample's domain's weights
        -> ``[B, L, out]`` (in that order too)."""
        return groups.linear(x, self.weight.transpose(1, 2), self.bias)


class SoftPromptedHead(nn.Module):
    """Action tokens + projected VLM / auxiliary tokens + soft prompts through plain blocks.

    Args:
        width: Token width (``head_hidden_size``).
        layers: Blocks.
        num_heads: Attention heads.
        features_dim: Width of the VLM and auxiliary view tokens.
        action_dim: Network action width (``max_action_dim``).
        state_dim: Padded state width (``max_state_dim``).
        time_dim: Flow-time embedding width.
        num_domains: Domains (soft prompts, action encoder and decoder per domain).
        soft_prompt_len: Prompt tokens per domain.
        max_seq_len: Rows of the learned positions.
        mlp_ratio: MLP width over ``width``.
        dropout: Block dropout while training.
        hetero_projection: Per-domain projections of the VLM / auxiliary tokens.
    """

    def __init__(self, width: int, layers: int, num_heads: int, features_dim: int, action_dim: int,
                 state_dim: int, time_dim: int, num_domains: int, soft_prompt_len: int, max_seq_len: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, hetero_projection: bool = False):
        super().__init__()
        self.time_dim = time_dim
        self.num_domains = num_domains
        self.hetero_projection = hetero_projection
        self.action_encoder = DomainLinear(action_dim + state_dim + time_dim, width, num_domains)
        if hetero_projection:
            self.features_proj = DomainLinear(features_dim, width, num_domains)
            self.aux_proj = DomainLinear(features_dim, width, num_domains)
        else:
            self.features_proj = nn.Linear(features_dim, width)
            self.aux_proj = nn.Linear(features_dim, width)
        self.positions = nn.Parameter(0.02 * torch.randn(max_seq_len, width))
        self.soft_prompts = nn.Parameter(0.02 * torch.randn(num_domains, soft_prompt_len, width))
        self.transformer = SelfAttentionStack(width, layers, num_heads, mlp_ratio, dropout)
        self.norm = nn.LayerNorm(width)
        self.action_decoder = DomainLinear(width, action_dim, num_domains)

    def _project(self, layer: nn.Module, x: torch.Tensor, groups: EmbodimentGroups) -> torch.Tensor:
        return layer(x, groups) if self.hetero_projection else layer(x)

    def forward(self, x_t: torch.Tensor, state: torch.Tensor, t: torch.Tensor, domain: torch.Tensor,
                features: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        """Predicted actions ``[B, chunk, action_dim]``.

        Args:
            x_t: Noisy action chunk ``[B, chunk, action_dim]``.
            state: Padded state ``[B, state_dim]``.
            t: Flow times ``[B]``.
            domain: Domain ids ``[B]``.
            features: VLM tokens ``[B, L, features_dim]``.
            aux: Tokens of the other camera views ``[B, L_aux, features_dim]`` (``L_aux`` may be 0).
        """
        b, chunk = x_t.shape[:2]
        # a mixed batch runs sorted by domain (each sample's tokens only meet its own), put back at the end
        groups = EmbodimentGroups(domain, self.num_domains, "model.num_domains")
        x_t, state, t, domain, features, aux = map(groups.sort, (x_t, state, t, domain, features, aux))
        time = time_embedding(t, self.time_dim)[:, None].expand(b, chunk, self.time_dim)
        inputs = torch.cat([x_t, state[:, None].expand(b, chunk, state.shape[-1]), time], dim=-1)
        x = torch.cat([self.action_encoder(inputs, groups), self._project(self.features_proj, features, groups),
                       self._project(self.aux_proj, aux, groups)], dim=1)
        if x.shape[1] > self.positions.shape[0]:
            raise ValueError(f"{x.shape[1]} tokens (chunk + VLM + auxiliary views) exceed model.max_seq_len="
                             f"{self.positions.shape[0]}")
        x = x + self.positions[None, : x.shape[1]]
        x = self.transformer(torch.cat([x, self.soft_prompts[domain]], dim=1))
        return groups.unsort(self.action_decoder(self.norm(x[:, :chunk]), groups))
