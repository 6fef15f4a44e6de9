"""InternVL as a loong VLM: the generic composer (tiles as fixed-size images at the image
placeholders) with InternVL's HF interop."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_vlm.hf_provider import HFVLMProvider
from loong_vlm.internvl.config import InternVLConfig


class InternVLProvider(HFVLMProvider):
    """InternVL: ``internvit`` + ``mlp_projector`` (2x2 pixel shuffle, LayerNorm after it) + any
    decoder; ``model.init_from_hf`` loads an ``InternVLForConditionalGeneration`` directory."""

    config: InternVLConfig
    hf_family = "internvl"

    def check_config(self, config: InternVLConfig) -> None:
        """InternVL's projector reads the pixel-shuffled patches."""
        p = config.projector
        if getattr(p, "name", None) == "mlp_projector" and not p.norm_after_merge and config.init_from_hf:
            raise ConfigError("model.projector.norm_after_merge must be true to load InternVL weights (its "
                              "LayerNorm runs over the pixel-shuffled vector).")
