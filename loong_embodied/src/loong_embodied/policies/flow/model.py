"""Flow-matching action-chunk policy on the torch engine.

Observation encoder (a small CNN per camera, an MLP over the state history, a task embedding)
gives a context vector; a residual MLP predicts the velocity of the action chunk at flow time
``t``: ``x_t = (1 - t) a + t noise``, target ``noise - a``; loss per sample is the mean squared
error over the chunk's non-padded actions. Sampling integrates from noise (``t = 1``) to
actions (``t = 0``) with Euler steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from loong_embodied.policies.flow.config import FlowPolicyConfig
from loong_embodied.policies.provider_base import ActionPolicyProvider


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` of flow times ``t`` in [0, 1]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def flow_noise(actions: torch.Tensor, seeds: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise like ``actions`` and flow times ``[B]`` in [0, 1).

    With per-sample ``seeds`` (the data's ``noise_seed``) each sample's draw depends on its seed
    only, not on the rank or micro batch it lands in (data-parallel runs then match one rank);
    without, they come from the global generator.
    """
    if seeds is None:
        return torch.randn_like(actions), torch.rand(actions.shape[0], device=actions.device)
    noise, times = [], []
    for seed in seeds.reshape(-1).tolist():
        g = torch.Generator().manual_seed(int(seed))
        times.append(torch.rand(1, generator=g))
        noise.append(torch.randn(actions.shape[1:], generator=g))
    return (torch.stack(noise).to(actions.device, actions.dtype),
            torch.cat(times).to(actions.device, actions.dtype))


class ResidualBlock(nn.Module):
    """LayerNorm -> Linear -> SiLU -> Linear, added to the input; modulated by the context."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width))
        self.film = nn.Linear(width, 2 * width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(context).chunk(2, dim=-1)
        return x + self.mlp(self.norm(x) * (1 + scale) + shift)


class FlowPolicy(nn.Module):
    """Observation encoder + velocity network; see the module docstring."""

    def __init__(self, c: FlowPolicyConfig):
        super().__init__()
        self.config = c
        w = c.hidden_size
        self.cameras = nn.ModuleList()
        for _ in c.image_keys:
            channels = c.image_size[0] if c.image_size else 3
            self.cameras.append(nn.Sequential(
                nn.Conv2d(channels, 32, 5, stride=2, padding=2), nn.SiLU(),
                nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.SiLU(),
                nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.SiLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, w)))
        self.state = nn.Sequential(nn.Linear(c.state_dim * c.n_obs_steps, w), nn.SiLU(), nn.Linear(w, w))
        self.task = nn.Embedding(max(c.num_tasks, 1), w)
        self.time = nn.Sequential(nn.Linear(c.frequency_dim, w), nn.SiLU(), nn.Linear(w, w))
        self.action_in = nn.Linear(c.action_dim * c.chunk_size, w)
        self.blocks = nn.ModuleList(ResidualBlock(w) for _ in range(c.num_layers))
        self.action_out = nn.Linear(w, c.action_dim * c.chunk_size)
        nn.init.zeros_(self.action_out.weight)
        nn.init.zeros_(self.action_out.bias)

    def encode(self, batch: dict) -> torch.Tensor:
        """Context ``[B, hidden]`` from the current camera frames, the state history and the task."""
        c = self.config
        state = batch["observation.state"].float().reshape(-1, c.state_dim * c.n_obs_steps)
        context = self.state(state) + self.task(batch["task_index"].long())
        for key, encoder in zip(c.image_keys, self.cameras):
            image = batch[key].float()
            if image.dim() == 5:                       # [B, T, C, H, W]: the current frame
                image = image[:, -1]
            context = context + encoder(image * 2.0 - 1.0)
        return context

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Predicted ``noise - actions`` ``[B, chunk, action_dim]`` at flow time ``t``."""
        cond = context + self.time(time_embedding(t, self.config.frequency_dim))
        h = self.action_in(x_t.flatten(1))
        for block in self.blocks:
            h = block(h, cond)
        return self.action_out(h).view_as(x_t)

    def forward(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.velocity(x_t, t, self.encode(batch))

    @torch.no_grad()
    def sample(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised action chunks ``[B, chunk, action_dim]`` by Euler integration from noise."""
        c = self.config
        context = self.encode(batch)
        x = torch.randn(context.shape[0], c.chunk_size, c.action_dim, generator=generator, device=context.device)
        steps = c.num_inference_steps
        for i in range(steps):
            t = torch.full((x.shape[0],), 1.0 - i / steps, device=x.device)
            x = x - self.velocity(x, t, context) / steps
        return x


class FlowPolicyProvider(ActionPolicyProvider):
    """Registers :class:`FlowPolicy` with the torch engine."""

    def build_torch_model(self) -> nn.Module:
        return FlowPolicy(self.config)

    def torch_blocks(self, model: Any) -> list[Any]:
        return list(model.blocks)

    def torch_forward_step(self, model: Any, batch: dict):
        actions = batch["action"].float()
        if actions.dim() == 2:                         # no chunk axis (chunk_size 1)
            actions = actions[:, None]
        noise, t = flow_noise(actions, batch.get("noise_seed"))
        x_t = (1.0 - t[:, None, None]) * actions + t[:, None, None] * noise
        pred = model(batch, x_t, t)
        valid = (~batch["action_is_pad"]).float() if "action_is_pad" in batch else torch.ones(actions.shape[:2])
        valid = valid.to(actions.device)[..., None]
        err = ((pred.float() - (noise - actions)) ** 2 * valid).sum(dim=(1, 2))
        per_sample = err / (valid.sum(dim=(1, 2)) * actions.shape[-1]).clamp(min=1.0)
        loss_sum = per_sample.sum()
        count = torch.tensor(float(actions.shape[0]), device=actions.device)
        return loss_sum, count, {"loss": torch.stack([loss_sum.detach(), count])}
