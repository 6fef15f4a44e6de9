"""ERNIE-4.5-VL as a loong VLM: the generic composer plus the per-token modality its decoder's
MoE layers route by, and the provider with ERNIE's HF interop."""

from __future__ import annotations

import torch

from loong_core.errors import ConfigError
from loong_vlm.composer import VisionLanguageModel
from loong_vlm.ernie4_5_vl.config import Ernie45VLConfig
from loong_vlm.hf_provider import HFVLMProvider


class ErnieVLComposer(VisionLanguageModel):
    """The composer with the resampler's grids and the vision-token mask.

    Before the decoder runs, every modality-isolated MoE layer of the foundation gets the micro
    batch's ``[s, b]`` mask of vision tokens (placeholders and ``vision_token_ids``), cut like the
    decoder's hidden states: this rank's context-parallel chunks, then its sequence-parallel
    slice. The mask is computed from the token ids, which every pipeline stage receives.
    """

    def __init__(self, config, language_model, encoder, projector, image_token_id, video_token_id=None,
                 vision_token_ids: tuple[int, ...] = ()):
        super().__init__(config, language_model, encoder, projector, image_token_id, video_token_id)
        from loong_vlm.ernie4_5_vl.moe import modality_layers

        self.moe_layers = modality_layers(language_model)
        ids = {image_token_id, video_token_id, *vision_token_ids} - {None}
        self.register_buffer("vision_token_ids", torch.tensor(sorted(ids), dtype=torch.long), persistent=False)

    def visual_features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Projected tokens; the resampler pairs frames, so it gets the grids too."""
        return self.projector(self.encoder(pixel_values, grid_thw), grid_thw)

    def vision_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's ``[s, b]`` vision-token mask of ``tokens`` ``[b, s]``."""
        mask = torch.isin(tokens, self.vision_token_ids.to(tokens.device)).transpose(0, 1).contiguous()
        mask = self.local_sequence(mask)
        if self.config.sequence_parallel:
            from megatron.core import parallel_state as ps

            size, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
            mask = mask.chunk(size, dim=0)[rank]
        return mask

    def forward(self, tokens, position_ids, attention_mask=None, images=None, labels=None, **visual):
        if self.moe_layers:
            from loong_vlm.ernie4_5_vl.moe import set_vision_mask

            set_vision_mask(self.moe_layers, self.vision_mask(tokens))
        return super().forward(tokens, position_ids, attention_mask, images=images, labels=labels, **visual)


class Ernie45VLProvider(HFVLMProvider):
    """ERNIE-4.5-VL: ``ernie_vit`` + ``ernie_resampler`` + the ``ernie4_5_vl_text`` decoder (or any
    decoder taking MRoPE positions); ``model.init_from_hf`` loads an
    ``Ernie4_5_VLMoeForConditionalGeneration`` directory."""

    config: Ernie45VLConfig
    hf_family = "ernie4_5_vl"

    def check_config(self, config: Ernie45VLConfig) -> None:
        """The projector merges the encoder's blocks; the decoder takes 3-row positions."""
        e, p = config.encoder, config.projector
        if getattr(p, "spatial_merge_size", e.spatial_merge_size) != e.spatial_merge_size:
            raise ConfigError(f"model.projector.spatial_merge_size = {p.spatial_merge_size} differs from "
                              f"model.encoder.spatial_merge_size = {e.spatial_merge_size}; set them equal.")
        if getattr(config.foundation, "position_embedding_type", None) != "mrope":
            raise ConfigError("ERNIE-4.5-VL gives its decoder 3D positions: set "
                              "model.foundation.position_embedding_type=mrope and model.foundation.mrope_section.")

    def composer_class(self):
        import functools

        return functools.partial(ErnieVLComposer, vision_token_ids=tuple(self.config.vision_start_token_ids))
