"""Dataset configs (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_core.config.schema import DataConfig


@dataclass
class DigitsDataConfig(DataConfig):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), scaled to [-1, 1].

    Attributes:
        valid_fraction: Share of the images held out for validation (a fixed permutation).
        split_seed: Seed of that permutation (independent of the training seed).
    """

    valid_fraction: float = 0.1
    split_seed: int = 0


@dataclass
class SyntheticLatentsConfig(DataConfig):
    """Deterministic random latents and text embeddings, shaped like a VAE / text encoder's output.

    Attributes:
        latent_shape: ``[C, H, W]`` (images) or ``[C, F, H, W]`` (video).
        text_length: Text tokens per sample.
        text_dim: Text embedding width.
        num_samples: Distinct samples (indices wrap around).
        data_seed: Seed of the content (a sample is a pure function of it and its index).
    """

    latent_shape: Optional[list[int]] = None
    text_length: int = 8
    text_dim: int = 32
    num_samples: int = 64
    data_seed: int = 0


@dataclass
class LatentCacheConfig(DataConfig):
    """Latents and text embeddings cached by ``loong data encode-latents``.

    Attributes:
        path: The cache folder (``index.json``, ``latents/``, ``text/``).
        text_length: Text tokens per sample: embeddings are zero-padded (or cut) to it, with a mask;
            None takes the longest caption in the cache.
        valid_fraction: Share of the samples held out for validation (the last ones, in index order);
            0 validates on the training samples.
    """

    path: Optional[str] = None
    text_length: Optional[int] = None
    valid_fraction: float = 0.0
