"""The Llama family as a megatron-core GPTModel with a local (no TransformerEngine) spec."""

from __future__ import annotations

from loong_llm.families.common.provider import DecoderProvider
from loong_llm.families.llama.config import LlamaConfig


class LlamaProvider(DecoderProvider):
    """Llama 2 / 3 / 3.1: RMSNorm, SwiGLU (``linear_fc1`` = [gate; up]), RoPE, GQA."""

    family = "llama"
    config: LlamaConfig
