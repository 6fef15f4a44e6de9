"""Config of the DeepSeek-V2 family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_llm.families.deepseek_v3.config import DeepSeekV3Config


@dataclass
class DeepSeekV2Config(DeepSeekV3Config):
    """DeepSeek-V2 style decoder: deepseek_v3's MLA (``q_lora_rank=None``, V2-Lite: one full
    query projection) and experts, routed by a softmax over all experts whose top-k weights are
    not renormalised (times ``moe_router_topk_scaling_factor``), with no expert bias and an
    auxiliary load-balancing loss."""

    q_lora_rank: Optional[int] = 1536
    moe_router_score_function: str = "softmax"
    moe_router_pre_softmax: bool = True
    moe_router_enable_expert_bias: bool = False
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 1.0e-3
