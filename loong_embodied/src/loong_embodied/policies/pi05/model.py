"""Pi0.5-style vision-language-action policy on the torch engine.

Prefix: SigLIP patch tokens of each camera, the instruction's byte tokens and the robot state cut
into ``state_bins`` discrete tokens (as Pi0.5 does, the state enters through the prompt). Suffix:
one token per action of the noisy chunk, after one continuous state token with ``state_token``
(Pi0's layout). A transformers decoder (Llama / Qwen2 layout) runs the
prefix; an action expert of its own width runs the suffix and, layer by layer, attends to the
backbone's keys and values (:mod:`loong_embodied.policies.pi05.layers`). The flow time enters the
expert through adaptive RMSNorm. Training: flow matching over the chunk with Pi0's Beta time
distribution; sampling: Euler steps from noise, the prefix keys/values computed once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow, tokens
from loong_embodied.policies.common.backbone import VisionEncoder, build_language_model
from loong_embodied.policies.common.conditioning import AdaRMSNorm
from loong_embodied.policies.pi05.config import Pi05Config
from loong_embodied.policies.pi05.layers import ExpertLayer, JointLayer
from loong_embodied.policies.provider_base import FlowMatchingVLAProvider


class Pi05Policy(nn.Module):
    """Vision-language prefix + action expert; see the module docstring."""

    def __init__(self, c: Pi05Config):
        super().__init__()
        if c.head_dim % 2:
            raise ConfigError(f"model.head_dim ({c.head_dim}) must be even (rotary embedding)")
        self.config = c
        self.vision = VisionEncoder(c)
        language = build_language_model(c, tokens.vocab_size(c.state_bins), c.num_layers)
        self.embed_tokens = language.embed_tokens
        self.rotary = language.rotary_emb
        expert = c.expert_hidden_size
        self.layers = nn.ModuleList(
            JointLayer(vlm, ExpertLayer(expert, c.expert_intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim,
                                        expert), prefix_output=i < c.num_layers - 1)
            for i, vlm in enumerate(language.layers))
        self.time_mlp = nn.Sequential(nn.Linear(c.time_embedding_dim, expert), nn.SiLU(), nn.Linear(expert, expert),
                                      nn.SiLU())
        self.action_in = nn.Linear(c.action_dim, expert)
        self.state_in = nn.Linear(c.state_dim, expert) if c.state_token else None
        self.final_norm = AdaRMSNorm(expert, expert)
        self.action_out = nn.Linear(expert, c.action_dim)

    def prefix(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix embeddings ``[B, Lp, hidden]`` and their validity mask ``[B, Lp]``."""
        c = self.config
        images = self.vision(batch)
        device = images.device
        ids, valid = tokens.encode_instructions(list(batch["task"]), c.max_text_tokens, device)
        if c.state_bins:
            state = batch["observation.state"].float()
            state = state[:, -1] if state.dim() == 3 else state
            ids = torch.cat([ids, tokens.discretize_state(state, c.state_bins)], dim=1)
            valid = torch.cat([valid, torch.ones_like(ids[:, c.max_text_tokens:], dtype=torch.bool)], dim=1)
        embeds = torch.cat([images, self.embed_tokens(ids)], dim=1)
        valid = torch.cat([torch.ones(images.shape[:2], dtype=torch.bool, device=device), valid], dim=1)
        return embeds, valid

    def encode_prefix(self, batch: dict) -> dict:
        """Everything the suffix needs from the prefix: embeddings, masks, rotary angles (and the
        state with ``state_token``)."""
        embeds, valid = self.prefix(batch)
        positions = valid.long().cumsum(-1) - 1
        c = self.config
        state_tokens = int(c.state_token)
        suffix_len = state_tokens + c.chunk_size
        suffix_positions = valid.long().sum(-1, keepdim=True) + torch.arange(suffix_len, device=embeds.device)
        suffix_allowed = torch.cat([valid[:, None, :].expand(-1, suffix_len, -1),
                                    torch.ones(suffix_len, suffix_len, dtype=torch.bool, device=valid.device)
                                    .expand(valid.shape[0], -1, -1)], dim=2)
        if state_tokens:   # Pi0: the state token sees the prefix and itself, not the actions
            suffix_allowed[:, 0, valid.shape[1] + 1:] = False
        p = {"embeds": embeds,
             "prefix_rope": self.rotary(embeds, positions),
             "suffix_rope": self.rotary(embeds, suffix_positions),
             "prefix_allowed": valid[:, None, None, :].expand(-1, 1, valid.shape[1], -1),
             "suffix_allowed": suffix_allowed[:, None]}
        if state_tokens:
            state = batch["observation.state"].float()
            p["state"] = state[:, -1] if state.dim() == 3 else state
        return p

    def time_condition(self, t: torch.Tensor) -> torch.Tensor:
        """Condition ``[B, expert]`` of the adaptive norms for flow times ``t`` ``[B]``."""
        return self.time_mlp(flow.sinusoidal(t, self.config.time_embedding_dim))

    def run_layers(self, p: dict, x_t: torch.Tensor | None, t: torch.Tensor | None, caches: list | None = None):
        """Through every layer: ``(velocity or None, prefix keys/values per layer)``."""
        prefix, caches = p["embeds"], caches or [None] * len(self.layers)
        suffix = self.action_in(x_t) if x_t is not None else None
        if suffix is not None and self.state_in is not None:
            suffix = torch.cat([self.state_in(p["state"].to(suffix.dtype))[:, None], suffix], dim=1)
        cond = self.time_condition(t) if t is not None else None
        kvs = []
        for layer, cache in zip(self.layers, caches):
            prefix, suffix, kv = layer(prefix, suffix, cond, p["prefix_rope"], p["suffix_rope"], p["prefix_allowed"],
                                       p["suffix_allowed"], cache)
            kvs.append(kv)
        if suffix is None:
            return None, kvs
        actions = suffix[:, -self.config.chunk_size:]
        return self.action_out(self.final_norm(actions, cond)[0]), kvs

    def forward(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Predicted velocity ``noise - actions`` ``[B, chunk, action_dim]`` at flow time ``t``."""
        return self.run_layers(self.encode_prefix(batch), x_t, t)[0]

    @torch.no_grad()
    def sample(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised action chunks ``[B, chunk, action_dim]``: Euler steps, prefix keys/values cached."""
        c = self.config
        p = self.encode_prefix(batch)
        _, caches = self.run_layers(p, None, None)
        shape = (p["embeds"].shape[0], c.chunk_size, c.action_dim)
        x = flow.euler_sample(lambda x_t, t: self.run_layers(p, x_t, t, caches)[0], shape, c.num_inference_steps,
                              p["embeds"].device, generator)
        return x.clamp(-c.action_clip, c.action_clip) if c.action_clip else x


class Pi05Provider(FlowMatchingVLAProvider):
    """Registers :class:`Pi05Policy` with the torch engine (Pi0's Beta flow-time distribution)."""

    policy_class = Pi05Policy

    def flow_time(self, u):
        return flow.pi0_time(u)

    def torch_blocks(self, model: Any) -> list[Any]:
        return [*model.vision.blocks(), *model.layers]
