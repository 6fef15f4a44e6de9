"""Flow matching over action chunks, one convention for every policy.

``x_t = (1 - t) * actions + t * noise``: ``t = 1`` is pure noise, ``t = 0`` the actions; the network
predicts the velocity ``noise - actions`` and sampling integrates from ``t = 1`` to ``t = 0``
(:func:`euler_sample`). A network may instead predict the actions themselves (X-VLA); it samples
with :func:`renoise_sample`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from loong_core.flow_matching import interpolate  # the one rectified-flow path, used here and by callers

# Beta(1.5, 1) by inverse CDF (its CDF is x ** 1.5): drawable from a seeded generator.
BETA_ALPHA = 1.5


def pi0_time(u: torch.Tensor) -> torch.Tensor:
    """Pi0's flow time from uniforms ``u``: ``0.001 + 0.999 * Beta(1.5, 1)``, weighted to noisy times."""
    return 0.001 + 0.999 * u.pow(1.0 / BETA_ALPHA)


def groot_time(u: torch.Tensor, s: float = 0.999) -> torch.Tensor:
    """GR00T N1's timestep (``tau = (s - Beta(1.5, 1)) / s``, 0 is noise) in this module's convention
    (``t = 1 - tau``), clipped to [0, 1]."""
    tau = (s - u.pow(1.0 / BETA_ALPHA)) / s
    return (1.0 - tau).clamp(0.0, 1.0)


def xvla_time(u: torch.Tensor) -> torch.Tensor:
    """X-VLA's flow time from uniforms ``u``: uniform on ``[0, 1 - 1e-5)`` (``u mod (1 - 1e-5)``)."""
    return u % (1 - 1e-5)


def flow_draws(actions: torch.Tensor, seeds: torch.Tensor | None,
               time_fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise like ``actions`` ``[B, chunk, dim]`` and flow times ``[B]`` from ``time_fn(uniform)``.

    With per-sample ``seeds`` (the data's ``noise_seed``) a sample's draw depends on its seed only,
    not on the rank or micro batch it lands in, so data-parallel runs follow one rank.
    """
    if seeds is None:
        u = torch.rand(actions.shape[0], device=actions.device)
        return torch.randn_like(actions), time_fn(u).to(actions.dtype)
    noise, uniforms = [], []
    for seed in seeds.reshape(-1).tolist():
        g = torch.Generator().manual_seed(int(seed))
        uniforms.append(torch.rand(1, generator=g))
        noise.append(torch.randn(actions.shape[1:], generator=g))
    times = time_fn(torch.cat(uniforms))
    return torch.stack(noise).to(actions.device, actions.dtype), times.to(actions.device, actions.dtype)


def masked_chunk_mean(error: torch.Tensor, batch: dict) -> torch.Tensor:
    """Per-sample mean ``[B]`` of an element-wise ``error`` ``[B, chunk, dim]`` over the chunk's
    non-padded actions (``action_is_pad``; all of them without it)."""
    if "action_is_pad" in batch:
        valid = (~batch["action_is_pad"].bool()).float().to(error.device)[..., None]
    else:
        valid = torch.ones(*error.shape[:2], 1, device=error.device)
    err = (error.float() * valid).sum(dim=(1, 2))
    return err / (valid.sum(dim=(1, 2)) * error.shape[-1]).clamp(min=1.0)


def masked_flow_loss(pred: torch.Tensor, target: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(loss_sum, count, metrics)`` as the torch engine wants: per-sample mean squared error over the
    chunk's non-padded actions (``action_is_pad``), summed over the micro batch."""
    per_sample = masked_chunk_mean((pred.float() - target.float()) ** 2, batch)
    loss_sum = per_sample.sum()
    count = torch.tensor(float(pred.shape[0]), device=pred.device)
    return loss_sum, count, {"loss": torch.stack([loss_sum.detach(), count])}


def chunk_actions(batch: dict) -> torch.Tensor:
    """The batch's action chunk ``[B, chunk, dim]`` (a missing chunk axis added)."""
    actions = batch["action"].float()
    return actions[:, None] if actions.dim() == 2 else actions


@torch.no_grad()
def euler_sample(velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shape: tuple[int, ...],
                 steps: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Integrate ``dx/dt = velocity(x, t)`` from noise at ``t = 1`` to ``t = 0`` in ``steps`` Euler steps."""
    x = torch.randn(shape, generator=generator).to(device)
    for i in range(steps):
        t = torch.full((shape[0],), 1.0 - i / steps, device=device)
        x = x - velocity(x, t) / steps
    return x


@torch.no_grad()
def renoise_sample(predict_actions: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shape: tuple[int, ...],
                   steps: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sampling for a network that predicts the actions from ``x_t`` (X-VLA's ``generate_actions``).

    At ``t = i / steps`` for ``i = steps .. 1`` the current estimate (zeros at first) is mixed with
    the one initial noise draw, ``x_t = (1 - t) * estimate + t * noise``, and the network's
    prediction becomes the next estimate; the last prediction is returned.
    """
    noise = torch.randn(shape, generator=generator).to(device)
    actions = torch.zeros_like(noise)
    for i in range(steps, 0, -1):
        t = torch.full((shape[0],), i / steps, device=device)
        x_t, _ = interpolate(actions, noise, t)
        actions = predict_actions(x_t, t)
    return actions


def sinusoidal(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` of flow times ``t`` in [0, 1] (scaled to ``[0, scale]``)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = scale * t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
