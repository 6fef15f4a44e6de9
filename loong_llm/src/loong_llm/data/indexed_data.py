"""The ``indexed`` dataset: train on a prefix written by ``loong data preprocess``.

``data=indexed data.prefix=PREFIX`` reads ``PREFIX.bin`` / ``PREFIX.idx`` with the tokenizer in
``PREFIX.tokenizer/`` (or ``data.tokenizer``) and serves megatron-core ``GPTDataset`` epochs, as
the ``text`` dataset does. Nothing is written next to the prefix: the sample indices are cached
under ``$LOONG_CACHE/indexed/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from loong_core.config.compose import cache_root
from loong_core.errors import ConfigError
from loong_llm.data.config import IndexedDataConfig
from loong_llm.data.indexed import EpochDataset, build_gpt_epochs, indexed_dataset_exists

logger = logging.getLogger(__name__)

_GOLDEN = 2654435761  # Knuth's multiplicative hash constant


def held_out_documents(num_documents: int, fraction: float) -> np.ndarray:
    """Boolean mask of the documents held out for validation.

    Document ``i`` is held out when ``(i * 2654435761) mod 2**32 < fraction * 2**32``: a fixed,
    evenly spread choice that depends only on the index. At least one document is held out and
    at least one kept (when there are two or more).

    Args:
        num_documents: Documents in the dataset.
        fraction: Fraction to hold out, in (0, 1).

    Returns:
        ``bool[num_documents]``, True for validation documents.
    """
    if num_documents < 2:
        raise ConfigError(
            f"The dataset has {num_documents} document(s): too few to hold some out for validation; "
            "set data.valid_prefix to a separate validation dataset."
        )
    hashed = (np.arange(num_documents, dtype=np.uint64) * np.uint64(_GOLDEN)) % np.uint64(2**32)
    valid = hashed < np.uint64(int(fraction * 2**32))
    if not valid.any():
        valid[int(np.argmin(hashed))] = True
    if valid.all():
        valid[int(np.argmax(hashed))] = False
    return valid


class IndexedDataModule:
    """Language-modelling samples from a preprocessed indexed dataset (a ``DataModule``).

    Args:
        config: The validated dataset config.
    """

    config_class = IndexedDataConfig

    def __init__(self, config: IndexedDataConfig):
        self.config = config
        self.tokenizer = None

    def inference_files(self) -> dict[str, Path]:
        """The tokenizer, copied into ``RUN/data/tokenizer/``."""
        path = self._tokenizer_path()
        return {"tokenizer" if path.is_dir() else "tokenizer/tokenizer.json": path}

    def _tokenizer_path(self) -> Path:
        if self.config.tokenizer:
            return Path(self.config.tokenizer)
        from loong_llm.data.preprocess import tokenizer_dir

        path = tokenizer_dir(self.config.prefix)
        if not path.exists():
            raise ConfigError(
                f"No tokenizer for data.prefix = {self.config.prefix!r} (looked for {path}); "
                "set data.tokenizer to the tokenizer used by `loong data preprocess`."
            )
        return path

    def _check_prefixes(self) -> None:
        for key in ("prefix", "valid_prefix"):
            prefix = getattr(self.config, key)
            if prefix is not None and not indexed_dataset_exists(prefix):
                raise ConfigError(
                    f"data.{key} = {prefix!r}: no {prefix}.bin + {prefix}.idx. Write them with "
                    f"`loong data preprocess FILES -o {prefix}`."
                )

    @property
    def cache_dir(self) -> Path:
        """Folder of megatron-core's sample indices for this prefix and split choice."""
        cfg = self.config
        key = {"prefix": os.path.abspath(cfg.prefix), "valid_prefix": cfg.valid_prefix and
               os.path.abspath(cfg.valid_prefix), "valid_fraction": cfg.valid_fraction}
        for name in ("prefix", "valid_prefix"):
            if key[name]:
                st = os.stat(f"{key[name]}.idx")
                key[f"{name}_idx"] = [st.st_size, st.st_mtime_ns]
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return cache_root(cfg.cache_dir) / "indexed" / f"{Path(cfg.prefix).name}-{digest}"

    def prepare(self) -> None:
        """Check that the prefix and tokenizer exist (the data is already tokenized)."""
        self._check_prefixes()
        self._tokenizer_path()

    def setup(self) -> None:
        """Load the tokenizer."""
        from loong_llm.data.hf_tokenizer import load_tokenizer

        self._check_prefixes()
        self.tokenizer = load_tokenizer(self._tokenizer_path())

    def model_overrides(self) -> dict[str, Any]:
        """``{"vocab_size": ...}`` of the tokenizer."""
        if self.tokenizer is None:
            self.setup()
        return {"vocab_size": self.tokenizer.vocab_size}

    def build(self, num_train_samples: int, num_valid_samples: int,
              seed: int) -> tuple[EpochDataset, EpochDataset]:
        """Return ``(train, valid)`` GPT samples (see :func:`build_gpt_epochs`)."""
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        if self.tokenizer is None:
            self.setup()
        cfg = self.config
        common = dict(seed=seed, seq_length=cfg.seq_length, tokenizer=self.tokenizer,
                      path_to_cache=str(self.cache_dir), shared_cache=cfg.shared_cache)
        if cfg.valid_prefix is not None:
            train = build_gpt_epochs(cfg.prefix, "train", num_train_samples, **common)
            valid = build_gpt_epochs(cfg.valid_prefix, "valid", num_valid_samples, **common)
            return train, valid
        lengths = IndexedDataset(cfg.prefix).sequence_lengths
        held_out = held_out_documents(len(lengths), cfg.valid_fraction)
        train_docs = np.flatnonzero(~held_out).astype(np.int32)
        valid_docs = np.flatnonzero(held_out).astype(np.int32)
        logger.info("%s: %d train / %d valid documents", cfg.prefix, train_docs.size, valid_docs.size)
        train = build_gpt_epochs(cfg.prefix, "train", num_train_samples, documents=train_docs, **common)
        valid = build_gpt_epochs(cfg.prefix, "valid", num_valid_samples, documents=valid_docs, **common)
        return train, valid

    def sample_cost(self, sample: dict) -> float:
        """Token count of a sample."""
        return float(len(sample["tokens"]))
