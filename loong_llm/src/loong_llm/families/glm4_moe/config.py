"""Config of the GLM-4.5 / 4.6 family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import MoEDecoderConfig


@dataclass
class Glm4MoEConfig(MoEDecoderConfig):
    """GLM-4.5 / 4.6 decoder: grouped-query attention with a bias on the query/key/value
    projection, optional per-head q/k RMSNorm (GLM-4.5 and 4.6 have it, 4.5-Air not), RoPE on the
    first half of each head (``rotary_percent=0.5``), dense first layers, then MoE layers with one
    shared expert and routed experts chosen by a sigmoid router whose aux-loss-free bias steers
    the selection only (weights renormalised, times ``moe_router_topk_scaling_factor``).
    Fields: :class:`~loong_llm.families.common.config.MoEDecoderConfig`."""

    add_qkv_bias: bool = True
    rotary_percent: float = 0.5
    rotary_base: float = 1000000.0
    moe_router_score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    moe_router_load_balancing_type: str = "none"
    moe_aux_loss_coeff: float = 0.0
