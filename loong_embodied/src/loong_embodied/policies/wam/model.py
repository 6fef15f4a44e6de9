"""The world-action model: loong_diffusion's DiT blocks over one sequence of context, action and
future-latent tokens.

Token order: ``[state, current latents | actions | future latents]``. The first group is clean
context; the action chunk and the future camera latents are noised at one shared flow time and
denoised jointly. Attention is masked so that context sees context, actions see context and
actions, and future latents see everything: the future is predicted from the observation and the
actions taken, while the actions never depend on the future tokens. Dropping the future tokens
therefore changes no action prediction, which is what makes sampling actions without the world
rollout (FastWAM's test-time shortcut) exact rather than an approximation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loong_core.errors import ConfigError
from loong_diffusion.families.dit.config import DiTConfig
from loong_diffusion.families.dit.model import DiTBlock, init_adaln_zero, modulate, timestep_embedding
from loong_diffusion.sampling import sigma_schedule
from loong_embodied.policies.wam.config import WAMConfig
from loong_embodied.policies.wam.latents import camera_latents


class WorldActionModel(nn.Module):
    """Predicts the flow velocities of an action chunk and of future camera latents; see the module
    docstring.

    Args:
        c: The policy config (its shapes filled by the data).
    """

    def __init__(self, c: WAMConfig):
        super().__init__()
        if not c.image_keys or not c.image_size:
            raise ConfigError("the wam policy predicts camera frames but the data gives none: use a dataset "
                              "with an image feature (data.image_keys=[observation.image])")
        if c.latent_size % c.latent_patch:
            raise ConfigError(f"model.latent_patch={c.latent_patch} must divide model.latent_size={c.latent_size}")
        self.config = c
        h = c.hidden_size
        dit = DiTConfig(name="dit", hidden_size=h, num_layers=c.num_layers, num_attention_heads=c.num_attention_heads,
                        mlp_ratio=c.mlp_ratio, frequency_dim=c.frequency_dim)
        self.blocks = nn.ModuleList(DiTBlock(dit) for _ in range(c.num_layers))
        self.patches = len(c.image_keys) * (c.latent_size // c.latent_patch) ** 2
        token_dim = c.image_size[0] * c.latent_patch ** 2
        self.state_in = nn.Sequential(nn.Linear(c.state_dim * c.n_obs_steps, h), nn.SiLU(), nn.Linear(h, h))
        self.obs_in = nn.Linear(token_dim, h)
        self.future_in = nn.Linear(token_dim, h)
        self.action_in = nn.Linear(c.action_dim, h)
        self.obs_pos = nn.Parameter(torch.zeros(1, self.patches, h))
        self.future_pos = nn.Parameter(torch.zeros(1, self.patches, h))
        self.action_pos = nn.Parameter(torch.zeros(1, c.chunk_size, h))
        self.time = nn.Sequential(nn.Linear(c.frequency_dim, h), nn.SiLU(), nn.Linear(h, h))
        self.task = nn.Embedding(max(c.num_tasks, 1), h)
        self.norm = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Linear(h, 2 * h)
        self.action_out = nn.Linear(h, c.action_dim)
        self.future_out = nn.Linear(h, token_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As loong_diffusion's DiT: Xavier linears, zero biases, adaLN-Zero blocks, zero outputs."""
        init_adaln_zero(self, self.blocks, [self.obs_pos, self.future_pos, self.action_pos, self.task.weight],
                        [self.ada, self.action_out, self.future_out])

    def context(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [B, 1 + patches, h], task embedding [B, h])``: the clean state and current latents."""
        c = self.config
        state = batch["observation.state"].float().reshape(-1, c.state_dim * c.n_obs_steps)
        obs = self.obs_in(camera_latents(batch, c)) + self.obs_pos
        return torch.cat([self.state_in(state)[:, None], obs], dim=1), self.task(batch["task_index"].long())

    def attention_mask(self, n_context: int, n_future: int, device) -> torch.Tensor:
        """``[S, S]`` (True: the row may attend to the column) for context, action, future tokens."""
        n_act = self.config.chunk_size
        size = n_context + n_act + n_future
        mask = torch.zeros(size, size, dtype=torch.bool, device=device)
        mask[:, :n_context] = True                            # everyone sees the context
        mask[n_context:, n_context:n_context + n_act] = True  # actions and future see the actions
        mask[n_context + n_act:, n_context + n_act:] = True   # the future sees itself
        return mask

    def denoise(self, context: tuple[torch.Tensor, torch.Tensor], actions: torch.Tensor,
                future: torch.Tensor | None, sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Velocities ``(noise - actions, noise - future or None)`` at noise levels ``sigmas [B]``.

        Args:
            context: :meth:`context` of the batch.
            actions: Noisy action chunk ``[B, chunk, action_dim]``.
            future: Noisy future latents ``[B, patches, token_dim]``, or None to leave the future
                tokens out (the action velocity is the same either way).
            sigmas: Shared flow time of both streams, in [0, 1].
        """
        tokens, task = context
        cond = self.time(timestep_embedding(sigmas * 1000.0, self.config.frequency_dim)) + task
        parts = [tokens, self.action_in(actions.to(tokens.dtype)) + self.action_pos]
        if future is not None:
            parts.append(self.future_in(future.to(tokens.dtype)) + self.future_pos)
        h = torch.cat(parts, dim=1)
        mask = self.attention_mask(tokens.shape[1], 0 if future is None else future.shape[1], h.device)
        for block in self.blocks:
            h = block(h, cond, mask)
        shift, scale = self.ada(F.silu(cond)).chunk(2, dim=-1)
        h = modulate(self.norm, h, shift, scale)
        start, stop = tokens.shape[1], tokens.shape[1] + actions.shape[1]
        return self.action_out(h[:, start:stop]), None if future is None else self.future_out(h[:, stop:])

    def forward(self, batch: dict, actions: torch.Tensor, future: torch.Tensor | None,
                sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.denoise(self.context(batch), actions, future, sigmas)

    @torch.no_grad()
    def rollout(self, batch: dict, generator: torch.Generator | None = None,
                world: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(actions [B, chunk, action_dim], future latents or None)`` by joint Euler integration
        from noise on the objective's (shifted) schedule.

        Args:
            batch: Observation (state, current camera frames, ``task_index``).
            generator: RNG of the initial noise (the actions' noise is drawn first, so it is the
                same with and without the world rollout).
            world: Also denoise the future latents; None: ``config.world_rollout``.
        """
        c = self.config
        world = c.world_rollout if world is None else world
        context = self.context(batch)
        b, device = context[0].shape[0], context[0].device
        actions = torch.randn(b, c.chunk_size, c.action_dim, generator=generator).to(device)
        future = None
        if world:
            token_dim = self.future_out.out_features
            future = torch.randn(b, self.patches, token_dim, generator=generator).to(device)
        sigmas = sigma_schedule(c.objective, c.num_inference_steps).to(device)
        for i in range(c.num_inference_steps):
            v_actions, v_future = self.denoise(context, actions, future, sigmas[i].expand(b))
            step = sigmas[i + 1] - sigmas[i]
            actions = actions + step * v_actions
            if future is not None:
                future = future + step * v_future
        if c.action_clip is not None:
            actions = actions.clamp(-c.action_clip, c.action_clip)
        return actions, future

    def sample(self, batch: dict, generator: torch.Generator | None = None) -> torch.Tensor:
        """Normalised action chunks ``[B, chunk, action_dim]`` (the policy interface of ``loong eval``)."""
        return self.rollout(batch, generator)[0]
