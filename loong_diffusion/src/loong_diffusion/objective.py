"""One flow-matching objective for every DiT; model differences live in the family's ``denoise``.

The loss of a sample is the (optionally weighted) mean squared error between the prediction and
``noise - x0`` over all its elements, in fp32. Noise and timesteps come either from per-sample
seeds (``batch["sample_seed"]``: the same sample gets the same noise whatever the data-parallel
layout, so DP runs follow the one-rank curve) or from the global RNG. Nothing here reads a value
back to the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from loong_core.flow_matching import interpolate  # the one rectified-flow path, used here and by callers
from loong_diffusion.config import FlowMatchConfig


def density(config: FlowMatchConfig, batch_size: int, generator=None, device=None) -> torch.Tensor:
    """Draw ``u`` in [0, 1] from ``config.timestep_sampling`` (same draws as diffusers' SD3 helper)."""
    if config.timestep_sampling == "logit_normal":
        u = torch.normal(mean=config.logit_mean, std=config.logit_std, size=(batch_size,),
                         generator=generator, device=device)
        return torch.sigmoid(u)
    u = torch.rand(batch_size, generator=generator, device=device)
    if config.timestep_sampling == "mode":
        u = 1 - u - config.mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


def shift_sigmas(config: FlowMatchConfig, sigmas: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
    """Apply the static or resolution-dependent shift to ``sigmas`` in (0, 1]."""
    if config.shift_mode == "resolution":
        if seq_len is None:
            raise ValueError("shift_mode=resolution needs the number of latent tokens")
        slope = (config.max_shift - config.base_shift) / (config.max_seq_len - config.base_seq_len)
        mu = config.base_shift + slope * (seq_len - config.base_seq_len)
        return math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1))
    if config.shift == 1.0:
        return sigmas
    return config.shift * sigmas / (1 + (config.shift - 1) * sigmas)


def sigmas_from_u(config: FlowMatchConfig, u: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
    """Noise levels for density draws ``u`` (on the training grid, then shifted)."""
    n = config.num_train_timesteps
    if n > 0:
        index = (u * n).long().clamp(max=n - 1)
        sigmas = (n - index).to(torch.float32) / n
    else:
        sigmas = u.to(torch.float32).clamp(min=1e-5)
    return shift_sigmas(config, sigmas, seq_len)


def loss_weights(config: FlowMatchConfig, sigmas: torch.Tensor) -> torch.Tensor | None:
    """Per-sample loss weights, or None for ``loss_weighting=none``."""
    if config.loss_weighting == "sigma_sqrt":
        return sigmas.float() ** -2.0
    if config.loss_weighting == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas + 2 * sigmas**2))
    return None


def weighted_error(config: FlowMatchConfig, prediction: torch.Tensor, target: torch.Tensor,
                   sigmas: torch.Tensor) -> torch.Tensor:
    """Element-wise squared error in fp32, times the per-sample weight of ``config.loss_weighting``."""
    error = (prediction.float() - target.float()) ** 2
    weights = loss_weights(config, sigmas)
    if weights is not None:
        error = weights.view(-1, *([1] * (error.dim() - 1))).float() * error
    return error


def seeded_draws(config: FlowMatchConfig, seeds: Sequence[int], shape: Sequence[int], device,
                 extra: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noise ``[B, *shape]``, density draws ``u [B]`` and ``extra`` uniforms ``[B, extra]`` from one
    generator per sample seeded with ``seeds[b]`` (host integers: no device read-back)."""
    noise, u, more = [], [], []
    for seed in seeds:
        gen = torch.Generator(device=device).manual_seed(int(seed))
        noise.append(torch.randn(tuple(shape), generator=gen, device=device))
        u.append(density(config, 1, generator=gen, device=device))
        more.append(torch.rand(extra, generator=gen, device=device))
    return torch.stack(noise), torch.cat(u), torch.stack(more)


class FlowMatching:
    """The training objective.

    Args:
        config: :class:`~loong_diffusion.config.FlowMatchConfig`.
    """

    def __init__(self, config: FlowMatchConfig):
        self.config = config

    def loss(self, denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x0: torch.Tensor,
             noise: torch.Tensor, u: torch.Tensor, seq_len: int | None = None,
             select: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Per-sample losses ``[B]`` (fp32) for given noise and density draws.

        Args:
            denoise: ``denoise(x_t, sigma) -> prediction`` of the velocity ``noise - x0``.
            x0: Clean latents ``[B, ...]``.
            noise: Gaussian noise like ``x0``.
            u: Density draws ``[B]`` (see :func:`density`).
            seq_len: Latent tokens per sample (``shift_mode=resolution``).
            select: Optional ``[B, ...] -> [B, ...]``: the elements of the prediction and the
                target the loss covers (a sequence-parallel rank's own tokens). The result is
                then the selected elements' share: their squared error summed over the
                sample's element count, so the shares of a partition sum to the whole loss.
        """
        sigmas = sigmas_from_u(self.config, u.to(x0.device), seq_len)
        x_t, target = interpolate(x0, noise, sigmas)
        prediction = denoise(x_t, sigmas)
        if select is not None:
            prediction, target = select(prediction), select(target)
        error = weighted_error(self.config, prediction, target, sigmas)
        if select is not None:
            return error.reshape(x0.shape[0], -1).sum(dim=1) / x0[0].numel()
        return error.reshape(x0.shape[0], -1).mean(dim=1)

    def draw(self, x0: torch.Tensor, seeds: Sequence[int] | None, extra: int = 0):
        """``(noise, u, extra uniforms)`` for a batch: per-sample seeds when given, else global RNG."""
        if seeds is not None:
            return seeded_draws(self.config, seeds, x0.shape[1:], x0.device, extra)
        b = x0.shape[0]
        return (torch.randn_like(x0), density(self.config, b, device=x0.device),
                torch.rand(b, extra, device=x0.device))
