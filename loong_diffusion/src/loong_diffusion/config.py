"""Configs shared by every diffusion model (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loong_core.config.schema import ModelConfig


@dataclass
class FlowMatchConfig:
    """The flow-matching objective: ``x_t = (1 - sigma) * x0 + sigma * noise``, target ``noise - x0``.

    Attributes:
        timestep_sampling: Density of ``u`` in [0, 1]: ``uniform``, ``logit_normal``
            (``sigmoid(N(logit_mean, logit_std))``) or ``mode`` (SD3's mode sampling).
        logit_mean: Mean of the logit-normal density.
        logit_std: Std of the logit-normal density.
        mode_scale: Scale of the mode density.
        num_train_timesteps: Grid of training timesteps (as diffusers'
            ``FlowMatchEulerDiscreteScheduler``): ``sigma = (N - floor(u * N)) / N`` before the shift;
            0 samples ``sigma = u`` continuously.
        shift: Static shift ``sigma' = shift * sigma / (1 + (shift - 1) * sigma)`` (1: none).
        shift_mode: ``static`` (``shift``) or ``resolution`` (``mu`` interpolated linearly in the
            number of latent tokens between ``base_shift`` at ``base_seq_len`` and ``max_shift`` at
            ``max_seq_len``; ``sigma' = e^mu / (e^mu + 1 / sigma - 1)``, as Flux / Qwen-Image).
        base_shift: ``mu`` at ``base_seq_len`` tokens.
        max_shift: ``mu`` at ``max_seq_len`` tokens.
        base_seq_len: Token count of ``base_shift``.
        max_seq_len: Token count of ``max_shift``.
        loss_weighting: ``none``, ``sigma_sqrt`` (``sigma^-2``) or ``cosmap`` (SD3 weightings).
    """

    timestep_sampling: Literal["uniform", "logit_normal", "mode"] = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29
    num_train_timesteps: int = 1000
    shift: float = 1.0
    shift_mode: Literal["static", "resolution"] = "static"
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_seq_len: int = 256
    max_seq_len: int = 4096
    loss_weighting: Literal["none", "sigma_sqrt", "cosmap"] = "none"


@dataclass
class DiffusionModelConfig(ModelConfig):
    """Base of every diffusion model config.

    Attributes:
        objective: The flow-matching objective.
        cond_dropout: Probability that a sample's condition is replaced by the null condition
            during training (classifier-free guidance).
        sample_steps: Default Euler steps of ``loong sample``.
        guidance_scale: Default classifier-free guidance scale of ``loong sample`` (1: none).
    """

    objective: FlowMatchConfig = field(default_factory=FlowMatchConfig)
    cond_dropout: float = 0.0
    sample_steps: int = 30
    guidance_scale: float = 1.0
