"""GR00T-style vision-language-action policy (N1.5 and N1.6 layouts) on the torch engine.

Backbone: SigLIP patch tokens of each camera and the instruction's byte tokens run through a
transformers decoder (Llama / Qwen2 layout) built with only ``num_layers`` layers, so its output is
the "middle layer" features GR00T conditions on. With ``tune_backbone=false`` (GR00T's default)
the backbone is frozen (no gradients, run without autograd) and only the action head trains;
``tune_top_llm_layers=k`` trains the decoder's last k layers too (N1.6: 4).

Action head, laid out as LeRobot 0.4.4's GR00T N1.5 head (``FlowmatchingActionHead``): the
features are LayerNorm-ed and pass ``vl_layers`` self-attention blocks; a state encoder (one
token, ReLU MLP), ``future_tokens`` learned tokens and an action encoder mixing each noisy action
with its timestep embedding (plus learned chunk positions) form the DiT's input; the DiT
alternates cross-attention to the features and self-attention, conditioned on the timestep
through adaptive LayerNorm; a ReLU decoder maps the action tokens to velocities. The state
encoder, action encoder and decoder have one set of weights per embodiment
(:mod:`~loong_embodied.policies.groot.embodiment`; the batch's ``embodiment_id`` picks them).
N1.6 (``model=groot_n16``) drops the VL self-attention blocks and the future tokens, and its DiT's
cross-attention blocks alternate between the text and the image tokens (``attend_text_every``). Flow matching
with GR00T's timestep distribution, the network seeing integer timestep buckets; Euler sampling
with ``num_inference_steps`` steps. Time runs as in :mod:`~loong_embodied.policies.common.flow`
(``t = 1`` is noise, velocity ``noise - actions``), the reverse of GR00T's: the checkpoint adapter
(:mod:`~loong_embodied.policies.groot.lerobot_adapter`) negates the decoder's last layer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from loong_core.errors import ConfigError
from loong_embodied.policies.common import flow, tokens
from loong_embodied.policies.common.backbone import VisionEncoder, build_language_model
from loong_embodied.policies.common.embodiment import EmbodimentGroups
from loong_embodied.policies.groot.config import GrootConfig
from loong_embodied.policies.groot.dit import DiT, SelfAttentionStack
from loong_embodied.policies.groot.embeddings import action_time_embedding, dit_time_embedding, timestep_buckets
from loong_embodied.policies.groot.embodiment import EmbodimentMLP
from loong_embodied.policies.provider_base import FlowMatchingVLAProvider


def mlp(dims: list[int], activation: type[nn.Module] = nn.SiLU) -> nn.Sequential:
    """Linear layers of ``dims`` with ``activation`` between them."""
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


# XOR-ed into a sample's noise seed: the state augmentation's draws, independent of its flow draws.
STATE_STREAM = 0x5EED5


class GrootPolicy(nn.Module):
    """VLM features + DiT flow-matching action head; see the module docstring."""

    def __init__(self, c: GrootConfig):
        super().__init__()
        self.config = c
        self.vision = VisionEncoder(c)
        self.language = build_language_model(c, tokens.vocab_size(), c.num_layers)
        if not c.tune_backbone:
            self.vision.requires_grad_(False)
            self.language.requires_grad_(False)
            if c.tune_top_llm_layers:
                if c.tune_top_llm_layers > c.num_layers:
                    raise ConfigError(f"model.tune_top_llm_layers={c.tune_top_llm_layers} exceeds the backbone's "
                                      f"model.num_layers={c.num_layers}")
                for layer in self.language.layers[-c.tune_top_llm_layers:]:
                    layer.requires_grad_(True)
                self.language.norm.requires_grad_(True)
        if c.hidden_size % c.vl_heads:
            raise ConfigError(f"model.vl_heads ({c.vl_heads}) must divide model.hidden_size ({c.hidden_size})")
        w = c.head_hidden_size
        self.features_norm = nn.LayerNorm(c.hidden_size)
        self.vl_attention = SelfAttentionStack(c.hidden_size, c.vl_layers, c.vl_heads)
        e = c.num_embodiments
        self.state_encoder = EmbodimentMLP(e, [c.state_dim * c.n_obs_steps, w, w], nn.ReLU)
        if not 0.0 <= c.state_dropout_prob <= 1.0 or c.state_noise_scale < 0.0:
            raise ConfigError(f"model.state_dropout_prob={c.state_dropout_prob} must lie in [0, 1] and "
                              f"model.state_noise_scale={c.state_noise_scale} must not be negative")
        self.state_mask = nn.Parameter(torch.zeros(1, 1, w)) if c.state_dropout_prob > 0 else None
        self.action_in = EmbodimentMLP(e, [c.action_dim, w])
        self.action_mix = EmbodimentMLP(e, [2 * w, w, w])
        self.action_positions = nn.Embedding(c.chunk_size, w)
        # none in N1.6 (and no empty parameter: FSDP2 cannot shard one)
        self.future_tokens = nn.Embedding(c.future_tokens, w) if c.future_tokens else None
        self.time_encoder = mlp([c.time_embedding_dim, w, w])
        self.dit = DiT(w, c.head_layers, c.head_heads, c.hidden_size, c.attend_text_every)
        self.action_decoder = EmbodimentMLP(e, [w, w, c.action_dim], nn.ReLU)

    def _trains_backbone(self) -> bool:
        return self.config.tune_backbone or self.config.tune_top_llm_layers > 0

    def backbone(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Backbone output ``[B, L, hidden]`` (frozen unless ``tune_backbone`` or ``tune_top_llm_layers``),
        its validity mask ``[B, L]`` and its image-token mask ``[B, L]`` (the camera tokens come first)."""
        c = self.config
        with torch.set_grad_enabled(self._trains_backbone() and torch.is_grad_enabled()):
            images = self.vision(batch)
            ids, valid = tokens.encode_instructions(list(batch["task"]), c.max_text_tokens, images.device)
            embeds = torch.cat([images, self.language.embed_tokens(ids)], dim=1)
            is_image = torch.zeros(valid.shape[0], embeds.shape[1], dtype=torch.bool, device=images.device)
            is_image[:, :images.shape[1]] = True
            valid = torch.cat([torch.ones(images.shape[:2], dtype=torch.bool, device=images.device), valid], dim=1)
            hidden = self.language(inputs_embeds=embeds, attention_mask=valid.long()).last_hidden_state
        return hidden, valid, is_image

    def condition(self, hidden: torch.Tensor, valid: torch.Tensor,
                  image: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The head's view of backbone output ``hidden``: LayerNorm, then the self-attention blocks
        (the masks pass through)."""
        return self.vl_attention(self.features_norm(hidden), valid), valid, image

    def features(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the DiT cross-attends to ``[B, L, hidden]``, its validity and its image-token masks ``[B, L]``."""
        return self.condition(*self.backbone(batch))

    def embodiments(self, batch: dict, batch_size: int, device: torch.device) -> EmbodimentGroups:
        """The batch's samples grouped by ``batch["embodiment_id"]`` (``model.embodiment_id`` when absent)."""
        ids = batch.get("embodiment_id")
        if ids is None:
            ids = torch.full((batch_size,), self.config.embodiment_id, device=device)
        return EmbodimentGroups(torch.as_tensor(ids).reshape(batch_size), self.config.num_embodiments)

    def velocity(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor, features: torch.Tensor,
                 valid: torch.Tensor, image: torch.Tensor | None = None,
                 groups: EmbodimentGroups | None = None) -> torch.Tensor:
        """Predicted ``noise - actions`` ``[B, chunk, action_dim]`` at flow time ``t`` given the features."""
        c = self.config
        b = x_t.shape[0]
        groups = groups or self.embodiments(batch, b, x_t.device)
        state = self.state_encoder(batch["observation.state"].float().reshape(b, -1), groups)[:, None]
        if self.training:
            state = self.augment_state(state, batch.get("noise_seed"))
        steps = timestep_buckets(t, c.timestep_buckets)
        time = action_time_embedding(steps, c.head_hidden_size)[:, None].expand(-1, c.chunk_size, -1)
        actions = self.action_mix(torch.cat([self.action_in(x_t, groups), time], dim=-1), groups)
        actions = actions + self.action_positions.weight[None]
        inputs = [state, actions]
        if self.future_tokens is not None:
            inputs.insert(1, self.future_tokens.weight[None].expand(b, -1, -1))
        cond = self.time_encoder(dit_time_embedding(steps, c.time_embedding_dim))
        out = self.dit(torch.cat(inputs, dim=1), cond, features, valid, image)
        return self.action_decoder(out[:, -c.chunk_size:], groups)

    def augment_state(self, state: torch.Tensor, seeds: torch.Tensor | None) -> torch.Tensor:
        """N1.6's training-time state augmentation of the state tokens ``[B, 1, width]``: the mask token
        in place of the state with ``state_dropout_prob``, plus Gaussian noise of ``state_noise_scale``.

        With per-sample ``seeds`` (the data's ``noise_seed``) a sample's draws depend on its seed only,
        as the flow draws do (from a stream of their own), so data-parallel runs follow one rank.
        """
        c = self.config
        if not c.state_dropout_prob and not c.state_noise_scale:
            return state
        seeds = None if seeds is None else torch.as_tensor(seeds).reshape(-1) ^ STATE_STREAM
        noise, drop_u = flow.flow_draws(state, seeds, lambda u: u)   # a uniform and noise like the token
        if c.state_noise_scale:
            state = state + c.state_noise_scale * noise
        if self.state_mask is not None:
            state = torch.where((drop_u < c.state_dropout_prob)[:, None, None], self.state_mask.to(state.dtype), state)
        return state

    def forward(self, batch: dict, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.velocity(batch, x_t, t, *self.features(batch))

    @torch.no_grad()
    def sample(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised action chunks ``[B, chunk, action_dim]``: Euler steps, backbone run once."""
        return self.sample_with(batch, *self.features(batch), generator=generator)

    @torch.no_grad()
    def sample_with(self, batch: dict, features: torch.Tensor, valid: torch.Tensor,
                    image: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`sample` given the :meth:`features` (clipped to ``action_clip`` when set)."""
        c = self.config
        shape = (features.shape[0], c.chunk_size, c.action_dim)
        groups = self.embodiments(batch, shape[0], features.device)
        x = flow.euler_sample(lambda x_t, t: self.velocity(batch, x_t, t, features, valid, image, groups), shape,
                              c.num_inference_steps, features.device, generator)
        return x.clamp(-c.action_clip, c.action_clip) if c.action_clip else x


class GrootProvider(FlowMatchingVLAProvider):
    """Registers :class:`GrootPolicy` with the torch engine (GR00T's flow-time distribution)."""

    policy_class = GrootPolicy

    def flow_time(self, u):
        return flow.groot_time(u, self.config.noise_s)

    def torch_blocks(self, model: Any) -> list[Any]:
        return [*model.vision.blocks(), *model.language.layers, *model.vl_attention.blocks, *model.dit.blocks]
