"""The Qwen3-MoE family: the shared MoE provider with Qwen3 attention."""

from __future__ import annotations

from loong_llm.families.common.moe import MoEProvider
from loong_llm.families.qwen3_moe.config import Qwen3MoEConfig


class Qwen3MoEProvider(MoEProvider):
    """Qwen3-MoE on megatron-core MoE layers (``mlp.router``, ``mlp.experts.local_experts.E``)."""

    family = "qwen3_moe"
    config: Qwen3MoEConfig
