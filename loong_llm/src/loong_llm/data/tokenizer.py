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
    """A ``tokenizers.Tokenizer`` with an end-of-document token (and usually a pad token).

    Hugging Face tokenizer files and directories (with their chat template) load through
    :func:`loong_llm.data.hf_tokenizer.load_tokenizer`.

    Args:
        tokenizer: The wrapped tokenizer.
        eod_token: Token that ends every document (``eos_token`` of a Hugging Face tokenizer).
        pad_token: Padding token, or None when the tokenizer has none.
        add_missing: Add ``eod_token`` / ``pad_token`` as special tokens when missing (this grows
            the vocabulary); when False a missing ``eod_token`` is an error and a missing pad
            token leaves :attr:`pad` at -1.
        chat_template: Jinja chat template (from ``tokenizer_config.json``), if any.
        template_tokens: Names the chat template reads besides the messages
            (``bos_token``, ``eos_token``, ...).

    Attributes:
        tokenizer: The wrapped ``tokenizers.Tokenizer``.
        splits_at_whitespace: True when every non-space -> space boundary starts a new
            pre-token (GPT-2 byte-level pre-tokenizer, no normalizer), so text cut there
            encodes to the same ids piece by piece.
        vocab_size: Number of ids, special tokens included.
        eod: Id of the end-of-document token, appended after every document.
        pad: Id of the padding token, or -1 when there is none (megatron-core then masks
            padded positions by that value).
        chat_template: The Jinja chat template, None when the tokenizer has none.
        unique_identifiers: JSON-able description (class, vocab size, SHA-256 of the serialized
            tokenizer) that megatron-core folds into its dataset cache keys.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        eod_token: str = EOD_TOKEN,
        pad_token: str | None = PAD_TOKEN,
        add_missing: bool = True,
        chat_template: str | None = None,
        template_tokens: dict[str, str] | None = None,
    ):
        wanted = [t for t in (eod_token, pad_token) if t is not None]
        missing = [t for t in wanted if tokenizer.token_to_id(t) is None]
        if missing and add_missing:
            logger.info("Adding special tokens %s to the tokenizer", missing)
            tokenizer.add_special_tokens(missing)
        elif tokenizer.token_to_id(eod_token) is None:
            raise ValueError(
                f"End-of-document token {eod_token!r} is not in the tokenizer's vocabulary; "
                "set eos_token in tokenizer_config.json or pass another eod_token."
            )
        self.tokenizer = tokenizer
        pre = tokenizer.pre_tokenizer
        self.splits_at_whitespace: bool = (
            tokenizer.normalizer is None
            and isinstance(pre, pre_tokenizers.ByteLevel)
            and pre.use_regex
            and not pre.add_prefix_space
        )
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod: int = tokenizer.token_to_id(eod_token)
        pad_id = tokenizer.token_to_id(pad_token) if pad_token is not None else None
        # -1 (megatron-core's "no pad token") when the tokenizer has none and none was added.
        self.pad: int = -1 if pad_id is None else pad_id
        self.chat_template: str | None = chat_template
        self.template_tokens: dict[str, str] = dict(template_tokens or {})
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
