"""The DeepSeek-V2 family: deepseek_v3's provider (megatron-core MLA and MoE)."""

from __future__ import annotations

from loong_llm.families.deepseek_v2.config import DeepSeekV2Config
from loong_llm.families.deepseek_v3.model import DeepSeekV3Provider


class DeepSeekV2Provider(DeepSeekV3Provider):
    """MLA (``linear_q_proj`` when ``q_lora_rank`` is None), dense first layers, shared +
    softmax-routed experts (set by :class:`DeepSeekV2Config`'s router defaults)."""

    family = "deepseek_v2"
    config: DeepSeekV2Config
