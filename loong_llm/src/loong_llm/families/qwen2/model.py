"""The Qwen2 family: the shared decoder provider with a qkv bias."""

from __future__ import annotations

from loong_llm.families.common.provider import DecoderProvider
from loong_llm.families.qwen2.config import Qwen2Config


class Qwen2Provider(DecoderProvider):
    """Qwen2 / Qwen2.5 (``linear_qkv`` carries a bias, interleaved by query group like its weight)."""

    family = "qwen2"
    config: Qwen2Config
