"""Config of the MiniMax-M2 family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import MoEDecoderConfig


@dataclass
class MiniMaxM2Config(MoEDecoderConfig):
    """MiniMax-M2 decoder: grouped-query attention with an explicit head dim whose query and key
    projections are RMS-normalised over the whole projection (all heads together, before RoPE;
    under tensor parallelism the sum of squares is all-reduced over the TP group), RoPE on the
    first ``rotary_percent`` of each head (HF ``rotary_dim / head_dim``), and in every layer an
    MoE MLP without shared expert whose sigmoid router picks the top-k experts by score plus an
    aux-loss-free ``expert_bias`` and renormalises the chosen scores.
    Fields: :class:`~loong_llm.families.common.config.MoEDecoderConfig`."""

    qk_layernorm: bool = True
    rotary_percent: float = 0.5
    rotary_base: float = 5000000.0
    norm_epsilon: float = 1.0e-6
    moe_router_score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    moe_router_load_balancing_type: str = "none"
    moe_aux_loss_coeff: float = 0.0
