"""Euler sampling of the flow-matching ODE, from noise (sigma = 1) to data (sigma = 0)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from loong_diffusion.objective import shift_sigmas


def sigma_schedule(config, steps: int, seq_len: int | None = None) -> torch.Tensor:
    """``steps + 1`` noise levels from 1 to 0, shifted like the training objective."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    sigmas[:-1] = shift_sigmas(config, sigmas[:-1], seq_len)
    return sigmas


@torch.no_grad()
def euler_sample(provider, model, shape, condition: dict, steps: int, guidance_scale: float = 1.0,
                 generator: torch.Generator | None = None, device=None,
                 on_step: Callable[[int], None] | None = None) -> torch.Tensor:
    """Integrate ``dx/dsigma = v(x, sigma)`` with ``steps`` Euler steps.

    Args:
        provider: The model's :class:`~loong_diffusion.provider.DiffusionProvider`.
        model: Its module (eval mode).
        shape: ``[B, C, ...]`` of the latents to generate.
        condition: The condition tensors (``class_label`` or ``text_embeds``/``text_mask``).
        steps: Euler steps.
        guidance_scale: Classifier-free guidance (1: none); ``v_u + g * (v_c - v_u)``.
        generator: RNG of the initial noise.
        device: Where to sample.
        on_step: Called with the number of finished steps after each one (a progress bar).

    Returns:
        The generated clean latents ``[B, C, ...]``.
    """
    x = torch.randn(tuple(shape), generator=generator).to(device)
    seq_len = provider.latent_tokens(x)
    sigmas = sigma_schedule(provider.config.objective, steps, seq_len).to(device)
    null = provider.null_condition(condition) if guidance_scale != 1.0 else None
    for i in range(steps):
        s = sigmas[i].expand(x.shape[0])
        v = provider.denoise(model, x, s, condition).float()
        if null is not None:
            v_uncond = provider.denoise(model, x, s, null).float()
            v = v_uncond + guidance_scale * (v - v_uncond)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
        if on_step is not None:
            on_step(i + 1)
    return x
