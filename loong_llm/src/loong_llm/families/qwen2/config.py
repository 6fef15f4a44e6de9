"""Config of the Qwen2 / Qwen2.5 family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import DecoderConfig


@dataclass
class Qwen2Config(DecoderConfig):
    """Qwen2 / Qwen2.5: a Llama-style decoder with ``add_qkv_bias=True`` (RoPE base 1e6,
    RMSNorm eps 1e-6). Fields: :class:`~loong_llm.families.common.config.DecoderConfig`."""

    add_qkv_bias: bool = True
    rotary_base: float = 1000000.0
    norm_epsilon: float = 1.0e-6
