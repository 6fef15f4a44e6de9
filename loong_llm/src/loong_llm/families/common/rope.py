"""Rotary-embedding inverse frequencies, including Llama 3.1's frequency scaling."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from loong_core.errors import ConfigError

if TYPE_CHECKING:
    import torch

ROPE_TYPES = ("default", "llama3")


def inv_freq(head_dim: int, base: float, scaling) -> torch.Tensor:
    """Inverse frequencies ``base^(-2i/d)`` with ``scaling`` applied (a ``RopeScalingConfig``).

    ``llama3`` keeps short wavelengths, divides long ones by ``factor`` and interpolates smoothly
    between ``original_max_position_embeddings / high_freq_factor`` and ``/ low_freq_factor``.
    Computed on the CPU whatever the default device (a model built on the meta device).
    """
    import torch

    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if scaling is None or scaling.rope_type == "default":
        return freqs
    if scaling.rope_type != "llama3":
        raise ConfigError(f"'model.rope_scaling.rope_type' = {scaling.rope_type!r} is not "
                          f"supported. Choices: {', '.join(ROPE_TYPES)}.")
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / scaling.factor, freqs)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def apply_to_model(model, head_dim: int, base: float, scaling) -> None:
    """Replace the inverse frequencies of a GPTModel's rotary embedding (no-op without one)."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or scaling is None or scaling.rope_type == "default":
        return
    rotary.inv_freq = inv_freq(head_dim, base, scaling).to(rotary.inv_freq.device)
