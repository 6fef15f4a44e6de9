"""Kimi-K2.5 as a loong VLM: the generic composer (MoonViT features merged by the projector at
the image / video placeholders) with Kimi-K2.5's HF interop."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_vlm.hf_provider import HFVLMProvider
from loong_vlm.kimi_k25.config import KimiK25Config


class KimiK25Provider(HFVLMProvider):
    """Kimi-K2.5: ``moonvit`` + ``qwen2_5_merger`` (LayerNorm) + a DeepSeek-V3 decoder (or any
    decoder with plain positions); ``model.init_from_hf`` loads a ``Kimi_K25ForConditionalGeneration``
    directory."""

    config: KimiK25Config
    hf_family = "kimi_k25"

    def check_config(self, config: KimiK25Config) -> None:
        """The projector merges the blocks the tower orders its patches by."""
        e, p = config.encoder, config.projector
        if getattr(p, "spatial_merge_size", e.spatial_merge_size) != e.spatial_merge_size:
            raise ConfigError(f"model.projector.spatial_merge_size = {p.spatial_merge_size} differs from "
                              f"model.encoder.spatial_merge_size = {e.spatial_merge_size}; set them equal.")
        if getattr(config.foundation, "position_embedding_type", None) == "mrope":
            raise ConfigError("Kimi-K2.5 gives its decoder plain 1D positions; set "
                              "model.foundation.position_embedding_type=rope.")
