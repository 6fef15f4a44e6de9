"""Config of the Qwen3.5 dense text family (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_llm.families.common.config import DecoderConfig
from loong_llm.families.qwen3_next.config import HybridStackFields


@dataclass
class Qwen3_5Config(HybridStackFields, DecoderConfig):
    """Qwen3.5 text model (dense): Qwen3-Next's hybrid stack of Gated DeltaNet and gated full
    attention (:class:`~loong_llm.families.qwen3_next.config.HybridStackFields`) with a dense
    SwiGLU MLP in every layer. Further fields:
    :class:`~loong_llm.families.common.config.DecoderConfig`."""

    def check(self, run, path: str) -> None:
        """Dense rules plus the hybrid stack's."""
        super().check(run, path)
        self.check_hybrid_stack(run, path)
