"""Config of the Qwen3-MoE family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import MoEDecoderConfig


@dataclass
class Qwen3MoEConfig(MoEDecoderConfig):
    """Qwen3-MoE: Qwen3 attention (q/k RMSNorm, explicit head dim) and MoE MLPs whose router
    takes a softmax over all experts, keeps the top-k and renormalises them
    (``moe_router_pre_softmax=False`` is exactly that), balanced by an auxiliary loss.
    Fields: :class:`~loong_llm.families.common.config.MoEDecoderConfig`."""

    qk_layernorm: bool = True
    rotary_base: float = 1000000.0
    norm_epsilon: float = 1.0e-6
