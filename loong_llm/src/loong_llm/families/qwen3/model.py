"""The Qwen3 dense family: the shared decoder provider with megatron-core's qk_layernorm."""

from __future__ import annotations

from loong_llm.families.common.provider import DecoderProvider
from loong_llm.families.qwen3.config import Qwen3Config


class Qwen3Provider(DecoderProvider):
    """Qwen3 dense (``self_attention.q_layernorm`` / ``k_layernorm`` are per-head RMSNorms)."""

    family = "qwen3"
    config: Qwen3Config
