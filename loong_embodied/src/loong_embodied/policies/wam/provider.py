"""Registers the world-action model with the torch engine and computes its two-term loss."""

from __future__ import annotations

from typing import Any

from loong_embodied.policies.provider_base import ActionPolicyProvider


class WAMProvider(ActionPolicyProvider):
    """Builds :class:`~loong_embodied.policies.wam.model.WorldActionModel`; its loss per sample is the
    action flow loss (over non-padded actions) plus ``world_loss_weight`` times the future-latent
    flow loss (zero where the future frame lies past the episode's end).

    Both terms come from one draw of loong_diffusion's objective: per-sample seeded noise for the
    packed ``[actions, future latents]``, one flow time per sample shared by both, the same
    interpolation, target and loss weighting as every DiT of loong_diffusion.
    """

    reported_metrics = ("loss", "action_loss", "world_loss")

    def build_torch_model(self):
        from loong_embodied.policies.wam.model import WorldActionModel

        return WorldActionModel(self.config)

    def torch_blocks(self, model: Any) -> list[Any]:
        return list(model.blocks)

    def losses(self, model: Any, batch: dict):
        """Per-sample ``(action_loss [B], world_loss [B])`` of one joint denoising pass."""
        import torch

        from loong_diffusion import objective
        from loong_embodied.policies.common import flow
        from loong_embodied.policies.wam.latents import camera_latents

        c = self.config
        actions = flow.chunk_actions(batch)
        future = camera_latents(batch, c, ".future").to(actions.device)
        n_act = actions[0].numel()
        x0 = torch.cat([actions.flatten(1), future.flatten(1)], dim=1)
        seeds = batch.get("noise_seed")
        seeds = None if seeds is None else seeds.reshape(-1).tolist()    # per-sample draws, as loong_diffusion
        noise, u, _ = objective.FlowMatching(c.objective).draw(x0, seeds)
        sigmas = objective.sigmas_from_u(c.objective, u.to(x0.device))
        x_t, target = objective.interpolate(x0, noise, sigmas)
        v_actions, v_future = model(batch, x_t[:, :n_act].view_as(actions), x_t[:, n_act:].view_as(future), sigmas)
        error = objective.weighted_error(c.objective, torch.cat([v_actions.flatten(1), v_future.flatten(1)], 1),
                                         target, sigmas)
        action_loss = flow.masked_chunk_mean(error[:, :n_act].view_as(actions), batch)
        world_loss = error[:, n_act:].mean(dim=1)
        pad = batch.get(f"{c.image_keys[0]}.future_is_pad")
        if pad is not None:
            world_loss = world_loss * (~pad.bool().reshape(-1)).float().to(world_loss.device)
        return action_loss, world_loss

    def torch_forward_step(self, model: Any, batch: dict):
        import torch

        action_loss, world_loss = self.losses(model, batch)
        loss_sum = (action_loss + self.config.world_loss_weight * world_loss).sum()
        count = torch.tensor(float(action_loss.shape[0]), device=action_loss.device)
        metrics = {"loss": torch.stack([loss_sum.detach(), count]),
                   "action_loss": torch.stack([action_loss.sum().detach(), count]),
                   "world_loss": torch.stack([world_loss.sum().detach(), count])}
        return loss_sum, count, metrics
