"""The rectified-flow path shared by every flow-matching model (diffusion DiTs and action policies).

``x_t = (1 - t) * x0 + t * noise``: ``t = 1`` is pure noise, ``t = 0`` the data, and the velocity
a network learns is ``noise - x0``. How ``t`` is drawn, weighted and integrated stays with each
modality (``loong_diffusion.objective``, ``loong_embodied.policies.common.flow``).
"""

from __future__ import annotations

import torch


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_t, target velocity)`` at per-sample flow times ``t`` ``[B]``.

    Args:
        x0: Clean data ``[B, ...]`` (latents, action chunks).
        noise: Gaussian noise shaped like ``x0``.
        t: Flow time (noise level) per sample in [0, 1].

    Returns:
        ``x_t`` in the dtype of ``x0`` and the velocity target ``noise - x0`` in fp32.
    """
    s = t.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1 - s) * x0 + s * noise, noise.float() - x0.float()
