"""Rotary-embedding inverse frequencies, including Llama 3.1's and YaRN's frequency scaling,
and YaRN's attention factor (transformers' ``_compute_yarn_parameters`` semantics)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from loong_core.errors import ConfigError

if TYPE_CHECKING:
    import torch

ROPE_TYPES = ("default", "llama3", "yarn")


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
    if scaling.rope_type == "yarn":
        return yarn_inv_freq(freqs, head_dim, base, scaling)
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


def yarn_inv_freq(freqs: torch.Tensor, head_dim: int, base: float, scaling) -> torch.Tensor:
    """YaRN: frequencies that turn more than ``beta_fast`` times over the original context are
    kept, those turning fewer than ``beta_slow`` times are divided by ``factor``, and a linear
    ramp over the dimensions blends the two in between."""
    import torch

    beta_fast, beta_slow = scaling.beta_fast or 32, scaling.beta_slow or 1
    old_len = scaling.original_max_position_embeddings

    def dim_of(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.truncate is None or scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    # transformers' operation order, so that the result is bit for bit its own
    periods = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
    return 1.0 / (scaling.factor * periods) * (1 - keep) + freqs * keep


def yarn_mscale(factor: float, coefficient: float = 1.0) -> float:
    """YaRN's ``0.1 * coefficient * ln(factor) + 1`` (1 when ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * coefficient * math.log(factor) + 1.0


def attention_factor(scaling) -> float:
    """The scale of cos and sin (so of the rotated query and key channels) under ``scaling``:
    transformers' explicit ``attention_factor``, else ``mscale(mscale) / mscale(mscale_all_dim)``
    when both are set and non-zero, else ``mscale(factor)``; 1 without YaRN."""
    if scaling is None or scaling.rope_type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)
    if scaling.mscale and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor,
                                                                         scaling.mscale_all_dim)
    return yarn_mscale(scaling.factor)


def mcore_mscale(scaling, mscale_all_dim: float) -> float:
    """The ``mscale`` that makes megatron-core's YaRN concentration factor
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` equal :func:`attention_factor`
    (megatron-core's own default differs from transformers' when only one mscale is set, and it
    has no explicit ``attention_factor``)."""
    target = attention_factor(scaling)
    if scaling.factor <= 1:
        if abs(target - 1.0) > 0:
            raise ConfigError(
                f"'model.rope_scaling.attention_factor' = {target} needs "
                f"'model.rope_scaling.factor' > 1 (it is {scaling.factor}).")
        return 1.0
    return (target * yarn_mscale(scaling.factor, mscale_all_dim) - 1.0) / (0.1 * math.log(scaling.factor))


def set_attention_factor(config, scaling) -> None:
    """Have megatron-core's (non-MLA) attention scale cos and sin by :func:`attention_factor`:
    it reads ``yarn_rotary_scaling_factor`` / ``yarn_mscale`` / ``yarn_mscale_all_dim`` from its
    ``TransformerConfig`` and passes the resulting factor to ``apply_rotary_pos_emb``."""
    if scaling is None or scaling.rope_type != "yarn":
        return
    config.yarn_rotary_scaling_factor = scaling.factor
    config.yarn_mscale = mcore_mscale(scaling, 0.0)
    config.yarn_mscale_all_dim = 0.0


def apply_to_model(model, head_dim: int, base: float, scaling) -> None:
    """Replace the inverse frequencies of a GPTModel's rotary embedding (no-op without one)."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or scaling is None or scaling.rope_type == "default":
        return
    rotary.inv_freq = inv_freq(head_dim, base, scaling).to(rotary.inv_freq.device)
