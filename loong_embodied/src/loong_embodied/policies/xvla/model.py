"""X-VLA-style vision-language-action policy on the torch engine.

Backbone (loong's, not X-VLA's Florence-2): SigLIP patch tokens of the first camera followed by
the instruction's byte tokens run through a transformers decoder (Llama / Qwen2 layout); its last
hidden states are the VLM tokens. The other cameras' projected patch tokens are X-VLA's auxiliary
view tokens and skip the language model, as in X-VLA.

Head: :class:`~loong_embodied.policies.xvla.head.SoftPromptedHead`, laid out as LeRobot 0.4.4's
``SoftPromptedTransformer``, with per-domain soft prompts and action encoder / decoder (the
domain is the batch's ``domain_id``, else ``model.domain_id``). As in X-VLA's ``auto`` action
space, the state is zero-padded to ``max_state_dim`` and the actions to ``max_action_dim``; the
network predicts the (padded) action chunk itself from ``x_t = (1 - t) actions + t noise``, its
loss is the mean squared error of the first ``action_dim`` channels, and it samples by
re-noising its estimate (:func:`~loong_embodied.policies.common.flow.renoise_sample`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow, tokens
from loong_embodied.policies.common.backbone import VisionEncoder, build_language_model
from loong_embodied.policies.provider_base import FlowMatchingVLAProvider
from loong_embodied.policies.xvla.config import XVLAConfig
from loong_embodied.policies.xvla.head import SoftPromptedHead


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` zero-padded on its last axis to ``size``."""
    return torch.cat([x, x.new_zeros(*x.shape[:-1], size - x.shape[-1])], dim=-1)


def _check(c: XVLAConfig) -> None:
    """Config errors before anything is built."""
    if c.max_action_dim < c.action_dim or c.max_state_dim < c.state_dim:
        raise ConfigError(f"model.max_action_dim ({c.max_action_dim}) and model.max_state_dim ({c.max_state_dim}) "
                          f"must be at least the data's action_dim ({c.action_dim}) and state_dim ({c.state_dim})")
    if not 0 <= c.domain_id < c.num_domains:
        raise ConfigError(f"model.domain_id={c.domain_id} is not one of the {c.num_domains} domains "
                          "(model.num_domains)")
    if c.head_hidden_size % c.head_heads:
        raise ConfigError(f"model.head_heads ({c.head_heads}) must divide model.head_hidden_size "
                          f"({c.head_hidden_size})")
    if c.image_size:
        patches = (c.image_size[-1] // c.patch_size) ** 2
        tokens_needed = c.chunk_size + patches * max(1, len(c.image_keys)) + c.max_text_tokens
        if tokens_needed > c.max_seq_len:
            raise ConfigError(f"model.max_seq_len={c.max_seq_len} is below the {tokens_needed} tokens of a sample "
                              "(chunk + image patches of every camera + max_text_tokens): raise it")


class XVLAPolicy(nn.Module):
    """VLM tokens + X-VLA's soft-prompted transformer; see the module docstring."""

    def __init__(self, c: XVLAConfig):
        super().__init__()
        _check(c)
        self.config = c
        self.vision = VisionEncoder(c)
        self.language = build_language_model(c, tokens.vocab_size(), c.num_layers)
        if not c.tune_backbone:
            self.vision.requires_grad_(False)
            self.language.requires_grad_(False)
        self.head = SoftPromptedHead(c.head_hidden_size, c.head_layers, c.head_heads, c.hidden_size,
                                     c.max_action_dim, c.max_state_dim, c.time_embedding_dim, c.num_domains,
                                     c.soft_prompt_len, c.max_seq_len, c.mlp_ratio, c.dropout, c.hetero_projection)

    def backbone(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """VLM tokens ``[B, patches + text, hidden]`` (first camera + instruction through the language
        model) and the auxiliary view tokens ``[B, (cameras - 1) * patches, hidden]``."""
        c = self.config
        with torch.set_grad_enabled(c.tune_backbone and torch.is_grad_enabled()):
            views = self.vision(batch).chunk(len(c.image_keys), dim=1)
            ids, valid = tokens.encode_instructions(list(batch["task"]), c.max_text_tokens, views[0].device)
            embeds = torch.cat([views[0], self.language.embed_tokens(ids)], dim=1)
            valid = torch.cat([torch.ones(views[0].shape[:2], dtype=torch.bool, device=ids.device), valid], dim=1)
            features = self.language(inputs_embeds=embeds, attention_mask=valid.long()).last_hidden_state
            aux = torch.cat(views[1:], dim=1) if len(views) > 1 else features.new_zeros(features.shape[0], 0,
                                                                                          features.shape[-1])
        return features, aux

    def domains(self, batch: dict, size: int, device) -> torch.Tensor:
        """Domain ids ``[B]``: the batch's ``domain_id`` or ``model.domain_id``."""
        if "domain_id" in batch:
            return torch.as_tensor(batch["domain_id"], device=device).reshape(-1).long().expand(size)
        return torch.full((size,), self.config.domain_id, dtype=torch.long, device=device)

    def predict(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor, features: torch.Tensor,
                aux: torch.Tensor) -> torch.Tensor:
        """Predicted (padded) action chunk ``[B, chunk, max_action_dim]`` from ``x_t`` at flow time ``t``."""
        state = batch["observation.state"].float()
        state = pad_last(state[:, -1] if state.dim() == 3 else state, self.config.max_state_dim)
        return self.head(x_t, state, t, self.domains(batch, x_t.shape[0], x_t.device), features, aux)

    def forward(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.predict(batch, x_t, t, *self.backbone(batch))

    @torch.no_grad()
    def sample(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised action chunks ``[B, chunk, action_dim]``; the backbone runs once."""
        return self.sample_with(batch, *self.backbone(batch), generator=generator)

    @torch.no_grad()
    def sample_with(self, batch: dict, features: torch.Tensor, aux: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`sample` given the :meth:`backbone` output (clipped to ``action_clip`` when set)."""
        c = self.config
        shape = (features.shape[0], c.chunk_size, c.max_action_dim)
        x = flow.renoise_sample(lambda x_t, t: self.predict(batch, x_t, t, features, aux), shape,
                                c.num_inference_steps, features.device, generator)[..., : c.action_dim]
        return x.clamp(-c.action_clip, c.action_clip) if c.action_clip else x


class XVLAProvider(FlowMatchingVLAProvider):
    """Registers :class:`XVLAPolicy` with the torch engine: X-VLA's time distribution and its loss on
    the predicted actions (not a velocity)."""

    policy_class = XVLAPolicy

    def flow_time(self, u):
        return flow.xvla_time(u)

    def torch_forward_step(self, model: Any, batch: dict):
        actions = flow.chunk_actions(batch)
        padded = pad_last(actions, self.config.max_action_dim)
        noise, t = flow.flow_draws(padded, batch.get("noise_seed"), self.flow_time)
        x_t, _ = flow.interpolate(padded, noise, t)
        return flow.masked_flow_loss(model(batch, x_t, t)[..., : actions.shape[-1]], actions, batch)

    def torch_blocks(self, model: Any) -> list[Any]:
        return [*model.vision.blocks(), *model.language.layers, *model.head.transformer.blocks]
