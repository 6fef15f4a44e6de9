"""Synthetic latents + text embeddings: lets text-conditioned DiTs train without a VAE or encoder."""

from __future__ import annotations

import torch

from loong_core.errors import ConfigError
from loong_diffusion.data.config import SyntheticLatentsConfig
from loong_diffusion.data.digits import sample_seed


class SyntheticSplit:
    """Item ``i``: latents and text embeddings drawn from a generator seeded by ``i % num_samples``."""

    def __init__(self, config: SyntheticLatentsConfig, length: int, seed: int, split: int):
        self.config, self.length, self.seed, self.split = config, length, seed, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        c = self.config
        content = i % c.num_samples + self.split * c.num_samples
        gen = torch.Generator().manual_seed(c.data_seed * 1_000_003 + content)
        text_len = 1 + content % c.text_length
        mask = torch.zeros(c.text_length, dtype=torch.long)
        mask[:text_len] = 1
        embeds = torch.randn(c.text_length, c.text_dim, generator=gen) * mask[:, None]
        return {"latents": torch.randn(*c.latent_shape, generator=gen), "text_embeds": embeds,
                "text_mask": mask, "sample_seed": sample_seed(self.seed, self.split, i)}


class SyntheticLatents:
    """Data module of :class:`SyntheticSplit` (nothing to prepare)."""

    def __init__(self, config: SyntheticLatentsConfig):
        if not config.latent_shape:
            raise ConfigError("'data.latent_shape' must be set, e.g. [16, 2, 8, 8] for a video latent.")
        self.config = config

    def prepare(self) -> None:
        """Nothing to cache."""

    def setup(self) -> None:
        """Nothing to load."""

    def model_overrides(self) -> dict:
        return {}

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int):
        return (SyntheticSplit(self.config, num_train_samples, seed, 0),
                SyntheticSplit(self.config, num_valid_samples, seed, 1))

    def sample_cost(self, sample: dict) -> float:
        return 1.0
