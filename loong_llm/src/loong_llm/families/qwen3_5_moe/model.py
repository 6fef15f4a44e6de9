"""The Qwen3.5-MoE text family: Qwen3-Next's provider under its own name."""

from __future__ import annotations

from loong_llm.families.qwen3_5_moe.config import Qwen3_5MoEConfig
from loong_llm.families.qwen3_next.model import Qwen3NextProvider


class Qwen3_5MoEProvider(Qwen3NextProvider):
    """Qwen3.5-MoE on megatron-core (the model is Qwen3-Next's)."""

    family = "qwen3_5_moe"
    config: Qwen3_5MoEConfig
