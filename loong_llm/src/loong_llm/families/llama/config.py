"""Config of the Llama family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import DecoderConfig


@dataclass
class LlamaConfig(DecoderConfig):
    """Llama 2 / 3 / 3.1: RMSNorm, SwiGLU, RoPE (optionally llama3-scaled), grouped-query
    attention, tied or untied embeddings. All fields are those of
    :class:`~loong_llm.families.common.config.DecoderConfig`."""
