"""Tokens of LLaVA conversations: a tokenizer with Qwen's vision tokens, placeholder expansion."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from loong_core.errors import ConfigError
from loong_llm.data.chat import CHATML_TEMPLATE, CHATML_TOKENS, tokenize_conversation
from loong_vlm.data.llava_format import IMAGE_PAD, VIDEO_PAD, VISION_TOKENS


def train_llava_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE over ``texts`` with the ChatML template, ChatML tokens and the vision tokens.

    Args:
        texts: Message texts (without the visual markup).
        vocab_size: Target vocabulary, special tokens included.
    """
    from loong_llm.data.tokenizer import TextTokenizer, train_bpe

    bpe = train_bpe(texts, vocab_size - len(CHATML_TOKENS) - len(VISION_TOKENS))
    bpe.tokenizer.add_special_tokens([*CHATML_TOKENS, *VISION_TOKENS])
    return TextTokenizer(bpe.tokenizer, chat_template=CHATML_TEMPLATE,
                         template_tokens={"eos_token": "<|im_end|>"})


def vision_token_ids(tokenizer, source: str) -> dict[str, int]:
    """Ids of the vision tokens; an error names ``source`` when the tokenizer lacks one."""
    ids = {token: tokenizer.tokenizer.token_to_id(token) for token in VISION_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ConfigError(f"the tokenizer {source} has no {', '.join(missing)} token(s); use a Qwen2-VL-style "
                          "tokenizer directory or data.tokenizer=null to train one with them.")
    return ids


def encode_messages(tokenizer, messages: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (one placeholder per visual input) and the 0/1 assistant mask, as int64 arrays."""
    ids, mask = tokenize_conversation(tokenizer, messages)
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int64)


def expand_placeholders(ids: np.ndarray, mask: np.ndarray, token_counts: dict[int, Sequence[int]],
                        where: str) -> tuple[np.ndarray, np.ndarray]:
    """Repeat each placeholder token as many times as its visual input has tokens.

    Args:
        ids: Token ids with one placeholder per image / video.
        mask: Assistant mask of ``ids``.
        token_counts: Placeholder id -> token count of each of its inputs, in reading order.
        where: The record's location, for errors.

    Returns:
        ``(ids, mask)`` expanded; placeholders are never trained on.

    Raises:
        ConfigError: The rendered text holds a different number of placeholders than inputs.
    """
    repeats = np.ones(len(ids), dtype=np.int64)
    for token_id, counts in token_counts.items():
        at = np.flatnonzero(ids == token_id)
        if len(at) != len(counts):
            raise ConfigError(f"{where}: the rendered conversation has {len(at)} placeholder(s) of token "
                              f"{token_id} but the record has {len(counts)} input(s) of that kind; the chat "
                              f"template or the text adds or drops {IMAGE_PAD}/{VIDEO_PAD}.")
        repeats[at] = np.asarray(counts, dtype=np.int64)
    expanded = np.repeat(ids, repeats)
    keep = ~np.isin(expanded, list(token_counts))
    return expanded, np.repeat(mask, repeats) * keep
