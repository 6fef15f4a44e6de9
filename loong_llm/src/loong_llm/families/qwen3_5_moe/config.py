"""Config of the Qwen3.5-MoE text family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.qwen3_next.config import Qwen3NextConfig


@dataclass
class Qwen3_5MoEConfig(Qwen3NextConfig):
    """Qwen3.5-MoE text model: Qwen3-Next's layers and fields
    (:class:`~loong_llm.families.qwen3_next.config.Qwen3NextConfig`); only the checkpoint layout
    differs."""
