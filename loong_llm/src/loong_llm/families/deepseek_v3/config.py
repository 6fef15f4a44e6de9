"""Config of the DeepSeek-V3 style family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_llm.families.common.config import MoEDecoderConfig


@dataclass
class DeepSeekV3Config(MoEDecoderConfig):
    """DeepSeek-V3 style decoder (megatron-core MLA / MoE names).

    Attributes:
        q_lora_rank: Rank of the compressed query (None: a full query projection).
        kv_lora_rank: Rank of the compressed key/value latent.
        qk_head_dim: Per-head query/key width without RoPE (HF ``qk_nope_head_dim``).
        qk_pos_emb_head_dim: Per-head RoPE width shared by all heads' keys (``qk_rope_head_dim``).
        v_head_dim: Per-head value width.
        rope_interleave: The HF checkpoint lays RoPE dims out in interleaved pairs (DeepSeek's
            layout, which megatron-core's MLA expects); when false the adapter interleaves those
            weight rows on the way in and splits them back on export.
    """

    q_lora_rank: Optional[int] = 1536
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True
    qk_layernorm: bool = True
    norm_epsilon: float = 1.0e-6
    moe_router_score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    moe_router_load_balancing_type: str = "none"
    moe_aux_loss_coeff: float = 0.0
