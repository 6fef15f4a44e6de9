"""GR00T N1.5's timestep inputs: discrete timestep buckets and their two sinusoidal embeddings.

GR00T runs its flow time the other way round from :mod:`loong_embodied.policies.common.flow`
(``tau = 1 - t``: 0 is noise, 1 the actions) and feeds the network ``floor(tau * buckets)``, an
integer step, not the continuous time. Two embeddings of that step are used:

- the action encoder's, ``[sin, cos]`` of ``step * 10000 ** (-i / half)``;
- the DiT's (a diffusers-style ``Timesteps(flip_sin_to_cos=True, downscale_freq_shift=1)``),
  ``[cos, sin]`` of ``step * 10000 ** (-i / (half - 1))``.

The arithmetic follows the reference operation by operation: at steps near 1000 the angles are
large, and a different rounding of the frequencies would move the sines by 1e-4.
"""

from __future__ import annotations

import math

import torch


def timestep_buckets(t: torch.Tensor, buckets: int) -> torch.Tensor:
    """Integer GR00T steps ``floor((1 - t) * buckets)`` of flow times ``t`` (loong's convention) ``[B]``."""
    return ((1.0 - t) * buckets).long()


def action_time_embedding(steps: torch.Tensor, dim: int) -> torch.Tensor:
    """``[sin, cos]`` embedding ``[..., dim]`` of integer steps ``[...]`` (the action encoder's)."""
    half = dim // 2
    exponent = -torch.arange(half, dtype=torch.float, device=steps.device) * (torch.log(torch.tensor(10000.0)) / half)
    freqs = steps.float().unsqueeze(-1) * exponent.exp()
    return torch.cat([freqs.sin(), freqs.cos()], dim=-1)


def dit_time_embedding(steps: torch.Tensor, dim: int) -> torch.Tensor:
    """``[cos, sin]`` embedding ``[B, dim]`` of integer steps ``[B]`` (the DiT's timestep input)."""
    half = dim // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=steps.device) / (half - 1)
    angles = steps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)
