"""The flow-matching loss equals a reference step written with diffusers' own scheduler and helpers."""

from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

from loong_diffusion.config import FlowMatchConfig
from loong_diffusion.families.wan.config import WanConfig
from loong_diffusion.families.wan.model import WanProvider
from loong_diffusion.objective import FlowMatching, density, seeded_draws, shift_sigmas

TINY_WAN = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=32,
                freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=32)


def reference_loss(model, scheduler, x0, noise, u, text, weighting):
    """One training step's loss as a diffusers user writes it (SD3 / Wan fine-tuning recipe)."""
    indices = (u * scheduler.config.num_train_timesteps).long()
    timesteps = scheduler.timesteps[indices]
    sigmas = scheduler.sigmas[indices].view(-1, 1, 1, 1, 1)
    noisy = (1.0 - sigmas) * x0 + sigmas * noise
    pred = model(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=text, return_dict=False)[0]
    weights = compute_loss_weighting_for_sd3(weighting, sigmas)
    per_sample = torch.mean((weights.float() * (pred.float() - (noise - x0).float()) ** 2).reshape(len(x0), -1), 1)
    return per_sample.mean()


@pytest.mark.parametrize("sampling, shift, weighting", [
    ("uniform", 1.0, "none"), ("logit_normal", 3.0, "none"), ("mode", 5.0, "cosmap"),
    ("logit_normal", 3.0, "sigma_sqrt"),
])
def test_loss_matches_diffusers_reference_on_the_same_batch_and_noise(sampling, shift, weighting):
    torch.manual_seed(0)
    config = WanConfig(**TINY_WAN, objective=FlowMatchConfig(timestep_sampling=sampling, shift=shift,
                                                            loss_weighting=weighting))
    provider = WanProvider(config)
    model = provider.build_torch_model().eval()
    x0, noise = torch.randn(4, 4, 3, 8, 8), torch.randn(4, 4, 3, 8, 8)
    text = torch.randn(4, 8, 32)
    u = compute_density_for_timestep_sampling(sampling, 4, logit_mean=0.0, logit_std=1.0, mode_scale=1.29,
                                              generator=torch.Generator().manual_seed(1))
    ours = provider.objective.loss(lambda x_t, s: provider.denoise(model, x_t, s, {"text_embeds": text}),
                                   x0, noise, u).mean()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    ref = reference_loss(model, scheduler, x0, noise, u, text, weighting)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=0), (ours.item(), ref.item())


@pytest.mark.parametrize("sampling", ["uniform", "logit_normal", "mode"])
def test_timestep_density_draws_what_diffusers_draws(sampling):
    config = FlowMatchConfig(timestep_sampling=sampling)
    ours = density(config, 64, generator=torch.Generator().manual_seed(3))
    ref = compute_density_for_timestep_sampling(sampling, 64, logit_mean=0.0, logit_std=1.0, mode_scale=1.29,
                                                generator=torch.Generator().manual_seed(3))
    assert torch.allclose(ours, ref, atol=1e-6)


def test_resolution_shift_equals_the_schedulers_dynamic_shift():
    config = FlowMatchConfig(shift_mode="resolution", base_shift=0.5, max_shift=1.15)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    sigmas = torch.linspace(1.0, 0.01, 50)
    for seq_len in (256, 1024, 4096):
        mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (seq_len - 256)
        assert torch.allclose(shift_sigmas(config, sigmas, seq_len), scheduler.time_shift(mu, 1.0, sigmas), atol=1e-6)


def test_seeded_noise_depends_only_on_the_sample_seed():
    config = FlowMatchConfig(timestep_sampling="logit_normal")
    noise_a, u_a, _ = seeded_draws(config, [11, 12, 13], (2, 4), "cpu")
    noise_b, u_b, _ = seeded_draws(config, [13], (2, 4), "cpu")
    assert torch.equal(noise_a[2], noise_b[0]) and torch.equal(u_a[2], u_b[0])


def test_a_perfect_velocity_has_zero_loss():
    objective = FlowMatching(FlowMatchConfig())
    x0, noise = torch.randn(3, 1, 8, 8), torch.randn(3, 1, 8, 8)
    loss = objective.loss(lambda x_t, s: noise - x0, x0, noise, torch.rand(3))
    assert loss.shape == (3,) and loss.abs().max() == 0
