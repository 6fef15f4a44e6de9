"""Train from a cache written by ``loong data encode-latents`` (no VAE or text encoder runs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from loong_core.data.manifest import check_cache
from loong_core.errors import ConfigError
from loong_diffusion.data.config import LatentCacheConfig
from loong_diffusion.data.digits import sample_seed
from loong_diffusion.data.encode import FORMAT


class LatentCacheSplit:
    """Item ``i``: cached sample ``ids[i % len(ids)]``, its text embeddings padded to ``text_length``."""

    def __init__(self, root: Path, records: list[dict], ids: list[int], length: int, text_length: int,
                 seed: int, split: int):
        self.root, self.records, self.ids, self.length = root, records, ids, length
        self.text_length, self.seed, self.split = text_length, seed, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        from safetensors.torch import load_file

        record = self.records[self.ids[i % len(self.ids)]]
        latents = load_file(str(self.root / record["latents"]))["latents"]
        text = load_file(str(self.root / record["text"]))["text_embeds"][: self.text_length]
        embeds = torch.zeros(self.text_length, text.shape[-1], dtype=text.dtype)
        embeds[: text.shape[0]] = text
        mask = torch.zeros(self.text_length, dtype=torch.long)
        mask[: text.shape[0]] = 1
        return {"latents": latents, "text_embeds": embeds, "text_mask": mask,
                "sample_seed": sample_seed(self.seed, self.split, i)}


class LatentCache:
    """Data module over an encoded cache; every sample must have latents and text embeddings."""

    def __init__(self, config: LatentCacheConfig):
        if not config.path:
            raise ConfigError("'data.path' must point at a cache written by 'loong data encode-latents'.")
        self.config = config
        self.root = Path(os.path.expanduser(config.path))

    def prepare(self) -> None:
        """Nothing to prepare: the cache is built by ``loong data encode-latents``."""

    def setup(self) -> None:
        index_file = self.root / "index.json"
        if not index_file.is_file():
            raise ConfigError(f"{index_file} not found; build the cache with 'loong data encode-latents'.")
        check_cache(self.root, "latent cache",
                    rebuild_hint=f"loong data encode-latents INPUT_DIR {self.root} with the options "
                                 "it was encoded with")
        index = json.loads(index_file.read_text(encoding="utf-8"))
        if index.get("format") != FORMAT:
            raise ConfigError(f"{index_file}: format {index.get('format')!r}, expected {FORMAT!r}.")
        self.records = index["samples"]
        lacking = [r["file"] for r in self.records if "latents" not in r or "text" not in r]
        if lacking:
            raise ConfigError(f"{self.root}: samples without latents or text embeddings (encode with --vae "
                              f"and --text-encoder): {lacking[:5]}")
        shapes = {tuple(r["latent_shape"]) for r in self.records}
        if len(shapes) > 1:
            raise ConfigError(f"{self.root}: latents of several shapes {sorted(shapes)} cannot be batched; "
                              "encode with one --resolution and --num-frames.")
        self.latent_shape = list(shapes.pop())
        self.text_length = self.config.text_length or max(1, max(r["text_tokens"] for r in self.records))
        n = len(self.records)
        n_valid = min(n - 1, round(n * self.config.valid_fraction)) if self.config.valid_fraction > 0 else 0
        self.train_ids = list(range(n - n_valid))
        self.valid_ids = list(range(n - n_valid, n)) or self.train_ids

    def model_overrides(self) -> dict:
        return {}

    def build(self, num_train_samples: int, num_valid_samples: int, seed: int):
        if not hasattr(self, "records"):
            self.setup()
        g = torch.Generator().manual_seed(seed)
        epochs = -(-num_train_samples // len(self.train_ids))
        order = [self.train_ids[j] for _ in range(epochs) for j in torch.randperm(len(self.train_ids), generator=g)]
        return (LatentCacheSplit(self.root, self.records, order, num_train_samples, self.text_length, seed, 0),
                LatentCacheSplit(self.root, self.records, self.valid_ids, num_valid_samples, self.text_length,
                                 seed, 1))

    def sample_cost(self, sample: dict) -> float:
        return 1.0
