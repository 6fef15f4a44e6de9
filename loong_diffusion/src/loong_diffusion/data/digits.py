"""Class-conditional images of handwritten digits from ``sklearn.datasets.load_digits``.

``prepare`` keeps a copy in the data cache (``<cache>/digits/digits.npz``, 120 KB), so a machine
that has the cache but not scikit-learn (a GPU node without internet) trains as well.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from loong_core.errors import MissingDependencyError
from loong_diffusion.data.config import DigitsDataConfig

logger = logging.getLogger(__name__)


def cache_file(cache_dir: str | None = None) -> Path:
    """Where :meth:`DigitsDataModule.prepare` keeps the images."""
    from loong_core.config.compose import cache_root

    return cache_root(cache_dir) / "digits" / "digits.npz"


def load_digits_array(cached: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images ``[N, 8, 8]`` in [-1, 1] (float32) and labels ``[N]`` (int64), from ``cached``
    when that file exists, else from scikit-learn."""
    if cached is not None and cached.is_file():
        with np.load(cached) as data:
            return data["images"].astype(np.float32) / 8.0 - 1.0, data["labels"].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise MissingDependencyError("sklearn", "scikit-learn", "the digits dataset") from None
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 8.0 - 1.0)
    return images, digits.target.astype(np.int64)


def sample_seed(seed: int, split: int, index: int) -> int:
    """A per-sample noise seed: distinct for every (run seed, split, index)."""
    return (seed * 1_000_003 + split * 7_919_993 + index) % (2**62)


class DigitSplit:
    """Map-style dataset: item ``i`` is image ``order[i % len(order)]`` with its label and seed."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, order: np.ndarray, length: int,
                 seed: int, split: int):
        self.images, self.labels, self.order = images, labels, order
        self.length, self.seed, self.split = length, seed, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        j = int(self.order[i % len(self.order)])
        return {"latents": torch.from_numpy(self.images[j]).unsqueeze(0),
                "class_label": torch.tensor(self.labels[j]),
                "sample_seed": sample_seed(self.seed, self.split, i)}


class DigitsDataModule:
    """The 8x8 digits, shuffled per epoch with the run seed; a fixed held-out validation split."""

    def __init__(self, config: DigitsDataConfig):
        self.config = config

    def prepare(self) -> None:
        """Copy scikit-learn's digits into the data cache (once)."""
        path = cache_file(self.config.cache_dir)
        if path.is_file():
            return
        images, labels = load_digits_array()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"digits.{os.getpid()}.tmp.npz")
        # Pixel values are the integers 0..16 of the original images: stored exactly as uint8.
        np.savez_compressed(tmp, images=np.rint((images + 1.0) * 8.0).astype(np.uint8), labels=labels)
        os.replace(tmp, path)

    def setup(self) -> None:
        self.images, self.labels = load_digits_array(cache_file(self.config.cache_dir))
        perm = np.random.default_rng(self.config.split_seed).permutation(len(self.labels))
        n_valid = int(round(len(perm) * self.config.valid_fraction))
        self.valid_ids, self.train_ids = perm[:n_valid], perm[n_valid:]

    def model_overrides(self) -> dict:
        return {"image_size": 8, "in_channels": 1, "num_classes": 10}

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int):
        rng = np.random.default_rng(seed)
        epochs = -(-num_train_samples // len(self.train_ids))
        order = np.concatenate([rng.permutation(self.train_ids) for _ in range(epochs)])
        train = DigitSplit(self.images, self.labels, order, num_train_samples, seed, 0)
        valid = DigitSplit(self.images, self.labels, self.valid_ids, max(num_valid_samples, len(self.valid_ids)),
                           seed, 1)
        logger.info("digits: %d train / %d validation images", len(self.train_ids), len(self.valid_ids))
        return train, valid

    def sample_cost(self, sample: dict) -> float:
        return 1.0
