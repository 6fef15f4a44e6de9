"""The model provider every diffusion family derives from: flow matching on the torch engine."""

from __future__ import annotations

from typing import Any

import torch

from loong_core.engines.model_provider import ModelProvider
from loong_core.engines.torch_native import ulysses
from loong_diffusion.objective import FlowMatching


class DiffusionProvider(ModelProvider):
    """Trains a denoiser with :class:`~loong_diffusion.objective.FlowMatching`.

    A family implements :meth:`build_torch_model`, :meth:`torch_blocks`, :meth:`denoise` (the call
    of its model in its own timestep convention), :meth:`null_condition` (for classifier-free
    guidance) and :meth:`condition` (what of a batch conditions the model).

    Batches hold ``latents`` (clean latents or pixels ``[B, C, ...]``), the condition
    (``class_label`` or ``text_embeds`` + ``text_mask``) and optionally ``sample_seed``.
    """

    engines = ("torch",)
    reported_metrics = ("loss",)
    throughput_unit = "samples"

    def __init__(self, config: Any):
        super().__init__(config)
        self.objective = FlowMatching(config.objective)

    # -- family interface -----------------------------------------------------------------------
    def denoise(self, model: Any, x_t: torch.Tensor, sigmas: torch.Tensor, condition: dict) -> torch.Tensor:
        """Predict the velocity ``noise - x0`` for ``x_t`` at noise levels ``sigmas`` (``[B]`` in [0, 1])."""
        raise NotImplementedError

    def condition(self, batch: dict) -> dict:
        """The conditioning tensors of a batch."""
        return {k: batch[k] for k in ("class_label", "text_embeds", "text_mask") if k in batch}

    def null_condition(self, condition: dict) -> dict:
        """The unconditional counterpart of ``condition`` (classifier-free guidance)."""
        raise NotImplementedError(f"{type(self).__name__} has no null condition")

    def drop_condition(self, condition: dict, drop: torch.Tensor) -> dict:
        """Replace the condition of samples where ``drop`` (bool ``[B]``) by the null condition."""
        null = self.null_condition(condition)
        out = {}
        for key, value in condition.items():
            mask = drop.view(-1, *([1] * (value.dim() - 1)))
            out[key] = torch.where(mask, null[key], value)
        return out

    def tokens(self, latents: torch.Tensor) -> torch.Tensor:
        """A latent-shaped tensor ``[B, C, ...]`` in the model's token layout ``[B, s, D]`` (the
        inverse of the unpatchify after its output projection): under Ulysses each rank's loss
        covers its contiguous ``1/N`` of these tokens."""
        raise NotImplementedError(f"{type(self).__name__} has no token layout")

    def latent_tokens(self, latents: torch.Tensor) -> int:
        """Tokens of one sample after patchifying (for the resolution-dependent shift)."""
        return int(latents[0].numel() // latents.shape[1])

    # -- engine interface ---------------------------------------------------------------------
    def torch_forward_step(self, model, batch: dict):
        x0 = batch["latents"]
        noise, u, extra = self.objective.draw(x0, batch.get("sample_seed"), extra=1)
        condition = self.condition(batch)
        if model.training and self.config.cond_dropout > 0:
            condition = self.drop_condition(condition, extra[:, 0] < self.config.cond_dropout)
        # Under Ulysses the prediction holds this rank's tokens only (zeros elsewhere, see
        # ulysses.pad): the loss covers those tokens and is this rank's share of each sample's
        # loss; the sample count, the same on every rank, is shared 1/N. The engine sums both.
        select = None
        if ulysses.group() is not None:
            def select(t):
                return ulysses.shard(self.tokens(t), dim=1)
        per_sample = self.objective.loss(lambda x_t, s: self.denoise(model, x_t, s, condition),
                                         x0, noise.to(x0.dtype), u, self.latent_tokens(x0), select)
        loss_sum = per_sample.sum()
        count = ulysses.loss_share(torch.tensor(float(x0.shape[0]), device=x0.device))
        return loss_sum, count, {"loss": torch.stack([loss_sum.detach(), count])}

    def tokens_in(self, batch: dict) -> int:
        latents = batch.get("latents")
        return int(latents.shape[0]) if latents is not None else 0

    def flops_per_token(self, seq_length: int) -> float:
        """Training FLOPs per sample (a diffusion model's "tokens" are samples); 0 when unknown."""
        return 0.0
