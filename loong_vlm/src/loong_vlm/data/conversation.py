"""Multimodal conversations -> model inputs: ChatML rendering, image placeholder expansion,
assistant-only loss."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from loong_llm.data.chat import CHATML_TEMPLATE, CHATML_TOKENS, tokenize_conversation

IMAGE_TOKEN = "<|image|>"


def train_vlm_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE over ``texts`` with the ChatML tokens and the image placeholder token."""
    from loong_llm.data.tokenizer import TextTokenizer, train_bpe

    bpe = train_bpe(texts, vocab_size - len(CHATML_TOKENS) - 1)
    bpe.tokenizer.add_special_tokens([*CHATML_TOKENS, IMAGE_TOKEN])
    return TextTokenizer(bpe.tokenizer, chat_template=CHATML_TEMPLATE,
                         template_tokens={"eos_token": "<|im_end|>"})


def encode_conversation(tokenizer, messages: Sequence[dict], image_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and assistant mask of a conversation, each image placeholder expanded.

    Args:
        tokenizer: A tokenizer from :func:`train_vlm_tokenizer` (or any with the image token).
        messages: ``{"role", "content"}`` messages; ``<|image|>`` marks where an image goes.
        image_tokens: Placeholder tokens per image (the encoder's output tokens per image).

    Returns:
        ``(ids, assistant)`` int64 arrays; placeholders are never trained on.
    """
    image_id = tokenizer.tokenizer.token_to_id(IMAGE_TOKEN)
    ids, mask = tokenize_conversation(tokenizer, messages)
    ids, mask = np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int64)
    repeats = np.where(ids == image_id, image_tokens, 1)
    return np.repeat(ids, repeats), np.repeat(mask, repeats) * (np.repeat(ids, repeats) != image_id)
