"""Config of the Qwen3 dense family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import DecoderConfig


@dataclass
class Qwen3Config(DecoderConfig):
    """Qwen3 dense: a Llama-style decoder with ``qk_layernorm=True`` (RMSNorm over each query and
    key head before RoPE) and an explicit head dimension (``kv_channels``, 128 in the published
    models). Fields: :class:`~loong_llm.families.common.config.DecoderConfig`."""

    qk_layernorm: bool = True
    rotary_base: float = 1000000.0
    norm_epsilon: float = 1.0e-6
