"""Byte-level BPE tokenizer (Hugging Face ``tokenizers``) with the attributes megatron-core reads.

megatron-core's ``GPTDataset`` uses ``tokenizer.eod`` (end of document, the loss/position reset
token), ``tokenizer.pad`` (masked out of the loss), ``tokenizer.vocab_size`` (token dtype) and
``tokenizer.unique_identifiers`` (a JSON-able dict hashed into its index-cache file names).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

logger = logging.getLogger(__name__)

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOD_TOKEN, PAD_TOKEN)


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` guaranteed to have an end-of-document and a pad token.

    Args:
        tokenizer: The wrapped tokenizer. ``<|endoftext|>`` and ``<|pad|>`` are added as special
            tokens when missing (this grows the vocabulary).

    Attributes:
        tokenizer: The wrapped ``tokenizers.Tokenizer``.
        splits_at_whitespace: True when every non-space -> space boundary starts a new
            pre-token (GPT-2 byte-level pre-tokenizer, no normalizer), so text cut there
            encodes to the same ids piece by piece.
        vocab_size: Number of ids, special tokens included.
        eod: Id of ``<|endoftext|>``, appended after every document.
        pad: Id of ``<|pad|>``, distinct from ``eod``.
        unique_identifiers: JSON-able description (class, vocab size, SHA-256 of the serialized
            tokenizer) that megatron-core folds into its dataset cache keys.
    """

    def __init__(self, tokenizer: Tokenizer):
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            logger.info("Adding special tokens %s to the tokenizer", missing)
            tokenizer.add_special_tokens(missing)
        self.tokenizer = tokenizer
        pre = tokenizer.pre_tokenizer
        self.splits_at_whitespace: bool = (
            tokenizer.normalizer is None
            and isinstance(pre, pre_tokenizers.ByteLevel)
            and pre.use_regex
            and not pre.add_prefix_space
        )
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod: int = tokenizer.token_to_id(EOD_TOKEN)
        self.pad: int = tokenizer.token_to_id(PAD_TOKEN)
        digest = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()
        self.unique_identifiers: dict[str, object] = {
            "class": type(self).__name__,
            "vocab_size": self.vocab_size,
            "sha256": digest,
        }

    @property
    def eos(self) -> int:
        """Alias of :attr:`eod` (the name some megatron-core code looks up)."""
        return self.eod

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens are added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel by the Rust library."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are dropped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def save(self, path: str | os.PathLike) -> None:
        """Write ``tokenizer.json`` to ``path`` atomically (temp file in the same folder)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            self.tokenizer.save(str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextTokenizer:
        """Read a Hugging Face ``tokenizer.json``."""
        return cls(Tokenizer.from_file(str(path)))

    def __repr__(self) -> str:
        return f"TextTokenizer(vocab_size={self.vocab_size}, eod={self.eod}, pad={self.pad})"


def train_bpe(texts: Iterable[str], vocab_size: int) -> TextTokenizer:
    """Train a byte-level BPE (GPT-2 style) on ``texts``.

    The pre-tokenizer splits on GPT-2's regex and maps bytes to printable symbols, so every
    string round-trips through ``decode(encode(text))``. The 256 byte symbols are always in the
    vocabulary; ``<|endoftext|>`` and ``<|pad|>`` take ids 0 and 1. Training is deterministic:
    the same texts give the same ``tokenizer.json``.

    Args:
        texts: Training documents.
        vocab_size: Target vocabulary size including the special tokens (at least 258).

    Returns:
        The trained tokenizer.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    result = TextTokenizer(tokenizer)
    if result.vocab_size < vocab_size:
        logger.warning(
            "BPE stopped at %d tokens (asked for %d): the training text has no more pairs seen twice",
            result.vocab_size,
            vocab_size,
        )
    return result
