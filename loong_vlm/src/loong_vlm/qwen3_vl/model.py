"""Qwen3-VL as a loong VLM: the composed module (deepstack injection) and its provider."""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.composer import VisionLanguageModel
from loong_vlm.hf_provider import HFVLMProvider
from loong_vlm.qwen3_vl.config import IdentityProjectorConfig, Qwen3VLConfig
from loong_vlm.qwen3_vl.deepstack import DeepstackInjector, dense_addends

#: Batch keys of each visual input kind and the composer attribute holding its placeholder id.
_VISUAL_KINDS = (("pixel_values", "image_token_id"), ("pixel_values_videos", "video_token_id"))


class IdentityProjector(MegatronModule):
    """Passes encoder features through unchanged (the encoder already outputs the foundation's
    width). Arguments as every projector's; ``input_size`` must equal ``output_size``."""

    def __init__(self, cfg: IdentityProjectorConfig, config, input_size: int, grid, output_size: int):
        super().__init__(config=config)
        if input_size != output_size:
            raise ConfigError(f"model.projector.name=identity needs encoder features as wide as the "
                              f"foundation: the encoder outputs {input_size}, the foundation's "
                              f"hidden_size is {output_size} (set model.encoder.out_hidden_size).")

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` unchanged."""
        return features


class Qwen3VLComposer(VisionLanguageModel):
    """The VLM composer plus DeepStack: the encoder returns ``(tokens, deepstack features)``; the
    tokens go to the placeholders, the deepstack features are added after the first decoder
    layers (see :mod:`loong_vlm.qwen3_vl.deepstack`)."""

    def __init__(self, config, language_model, encoder, projector, image_token_id: int | None,
                 video_token_id: int | None = None):
        super().__init__(config, language_model, encoder, projector, image_token_id, video_token_id)
        self._deepstack_features: list[list[torch.Tensor]] = []
        self.deepstack = None
        layers = len(getattr(getattr(encoder, "cfg", None), "deepstack_visual_indexes", []) or [])
        if encoder is not None and layers:
            self.deepstack = DeepstackInjector(language_model.decoder, layers, config.sequence_parallel)

    def visual_features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Merged tokens ``[n, h]``; the deepstack features are kept for :meth:`embed`."""
        tokens, deepstack = self.encoder(pixel_values, grid_thw)
        self._deepstack_features.append(deepstack)
        return self.projector(tokens)

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor | None,
              images: torch.Tensor | None = None, visual: dict | None = None) -> torch.Tensor:
        """Decoder input with the visual tokens placed; arms the deepstack additions."""
        self._deepstack_features = []
        embeddings = super().embed(tokens, position_ids, images, visual)
        if self.deepstack is not None:
            visual = visual or {}
            # the base embed encodes images, then videos, each only when present
            ids = [getattr(self, attr) for key, attr in _VISUAL_KINDS
                   if visual.get(key) is not None and visual[key].numel() > 0]
            placed = list(zip(ids, self._deepstack_features))
            addends = dense_addends(tokens, placed, self.config.hidden_size, embeddings.dtype)
            addends = [self.local_sequence(addend) for addend in addends]  # CP: as the decoder input
            embeddings = self.deepstack.set(embeddings, addends)
        self._deepstack_features = []
        return embeddings


class Qwen3VLProvider(HFVLMProvider):
    """Qwen3-VL: ``qwen3_vit`` + identity projector + a Qwen3 foundation with interleaved MRoPE
    and DeepStack; ``model.init_from_hf`` loads a ``Qwen3VLForConditionalGeneration`` directory
    (architecture and weights, vision tower included)."""

    config: Qwen3VLConfig
    hf_family = "qwen3_vl"

    def check_config(self, config: Qwen3VLConfig) -> None:
        """The foundation takes MRoPE positions."""
        if getattr(config.foundation, "position_embedding_type", None) != "mrope":
            raise ConfigError("Qwen3-VL needs MRoPE positions: set model.foundation.position_embedding_type"
                              "=mrope and model.foundation.mrope_section (e.g. [24, 20, 20]).")

    def composer_class(self):
        return Qwen3VLComposer

    def build_megatron_model(self, config, pre_process: bool, post_process: bool, vp_stage):
        from loong_vlm.qwen3_vl.rope import InterleavedMRoPE

        model = super().build_megatron_model(config, pre_process, post_process, vp_stage)
        if self.config.mrope_interleaved:
            lm = model.language_model
            lm.rotary_pos_emb = InterleavedMRoPE.replacing(lm.rotary_pos_emb)
        return model


class Qwen3VLMoeProvider(Qwen3VLProvider):
    """Qwen3-VL-MoE: :class:`Qwen3VLProvider` over a ``qwen3_moe`` foundation; ``model.init_from_hf``
    loads a ``Qwen3VLMoeForConditionalGeneration`` directory."""

    hf_family = "qwen3_vl_moe"
