"""The GLM-4.5 / 4.6 family: the shared MoE provider (megatron-core's block spec takes the qkv
bias, the q/k norms and the partial rotary from the TransformerConfig)."""

from __future__ import annotations

from loong_llm.families.common.moe import MoEProvider
from loong_llm.families.glm4_moe.config import Glm4MoEConfig


class Glm4MoEProvider(MoEProvider):
    """GLM-4.5 on megatron-core: ``linear_qkv`` with bias, RoPE over ``rotary_percent`` of each
    head, dense first layers, MoE layers with ``mlp.shared_experts`` and a sigmoid ``mlp.router``
    with ``expert_bias`` (updated from the per-step token counts, no aux loss)."""

    family = "glm4_moe"
    config: Glm4MoEConfig
