"""Config classes of ERNIE-4.5-VL (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from loong_core.config.schema import ModelConfig, component
from loong_llm.families.common.config import MoEDecoderConfig
from loong_vlm.config import DynamicViTConfig, VLMConfig


@dataclass
class ErnieViTConfig(DynamicViTConfig):
    """ERNIE-4.5-VL's vision tower (a Qwen2-VL-style ViT): a bias-free linear embedding of each
    ``C x patch x patch`` patch (one frame per patch), LayerNorm blocks with a ``quick_gelu`` MLP
    and 2D RoPE (a quarter of each head's frequencies turn with the patch row, a quarter with its
    column, rotate-half layout), attention within each frame, and a final LayerNorm. The output is
    one feature per patch in merge-block order, for the ``ernie_resampler`` projector.

    Inputs follow the dynamic-resolution convention (``docs/vlm_inputs.md``): ``[P, C * p^2]``
    rows, frame by frame, each frame's patches in merge-block order, with ``[t, h, w]`` grids
    (``data.image_processing=ernie``, as transformers' ERNIE-4.5-VL processors cut them).

    Attributes (besides :class:`~loong_vlm.config.DynamicViTConfig`'s; its LayerNorms use HF
    ``rms_norm_eps`` as ``norm_epsilon``):
        hidden_act: MLP activation (HF ``hidden_act``).
    """

    image_processing: ClassVar[str] = "ernie"  # the preprocessing it reads (the data checks it)

    patch_size: int = 14
    ffn_hidden_size: int = 256
    hidden_act: Literal["quick_gelu", "gelu"] = "quick_gelu"


@dataclass
class ErnieResamplerConfig(ModelConfig):
    """ERNIE-4.5-VL's projector (HF ``VariableResolutionResampler``): each ``m x m`` block of
    patch features concatenated -> Linear -> GELU -> Linear -> LayerNorm (spatial); then each pair
    of consecutive frames concatenated (an image is paired with itself) -> Linear -> GELU ->
    Linear -> LayerNorm (temporal); then Linear to the foundation's width -> RMSNorm.

    Attributes:
        spatial_merge_size: Side of the merged patch block (the encoder's).
        temporal_merge_size: Frames merged into one token (2; HF ``temporal_merge_size``).
        layer_norm_epsilon: Epsilon of the two LayerNorms (HF ``vision_config.rms_norm_eps``).
        norm_epsilon: Epsilon of the final RMSNorm (HF ``text_config.rms_norm_eps``).
        freeze: Keep the projector's weights fixed.
    """

    spatial_merge_size: int = 2
    temporal_merge_size: Literal[2] = 2
    layer_norm_epsilon: float = 1.0e-6
    norm_epsilon: float = 1.0e-5
    freeze: bool = False


@dataclass
class ErnieVLTextConfig(MoEDecoderConfig):
    """ERNIE-4.5-VL's decoder: GQA attention without biases, 3D RoPE (``mrope``: rotated pairs in
    interleaved order; pair ``j`` of the first ``mrope_section[0] + mrope_section[1]`` turns with
    the height position when ``j`` is even and the width position when odd, the last
    ``mrope_section[2]`` with time), dense first layers, then modality-isolated MoE layers: text
    tokens go to the text router and experts, vision tokens (placeholders and their start / end
    tokens) to a vision router and experts of their own width, all tokens through the shared
    experts. Each router takes a softmax over its experts, picks the top-k of
    ``probability + expert bias`` and renormalises the picked probabilities.

    Attributes:
        vision_moe_ffn_hidden_size: Inner width of each vision expert (HF
            ``moe_intermediate_size[1]``; ``moe_ffn_hidden_size`` is the text experts').
        mrope_section: Rotary pairs given to height, width and time (HF order; sums to
            ``head_dim / 2``, the first two equal).
    """

    vision_moe_ffn_hidden_size: Optional[int] = None
    position_embedding_type: Literal["rope", "mrope"] = "mrope"
    rotary_base: float = 500000.0
    norm_epsilon: float = 1.0e-5


def _ernie_vit() -> ErnieViTConfig:
    return ErnieViTConfig(name="ernie_vit")


def _resampler() -> ErnieResamplerConfig:
    return ErnieResamplerConfig(name="ernie_resampler")


def _ernie_text() -> ErnieVLTextConfig:
    return ErnieVLTextConfig(name="ernie4_5_vl_text", mrope_section=[6, 6, 4])


@dataclass
class Ernie45VLConfig(VLMConfig):
    """ERNIE-4.5-VL (``Ernie4_5_VLMoeForConditionalGeneration``): the ``ernie_vit`` tower, the
    ``ernie_resampler`` projector (spatial 2x2 and temporal 2-frame merging) and the
    ``ernie4_5_vl_text`` decoder (3D RoPE, modality-isolated experts). Any decoder composes in its
    place; the vision-token mask only reaches decoders with modality-isolated MoE layers.

    Attributes:
        encoder: The vision tower (``ernie_vit``).
        projector: ``ernie_resampler``.
        foundation: An ``ernie4_5_vl_text`` decoder.
        vision_start_token_ids: Tokens that open / close an image or video (HF
            ``image_start_token_id``, ``image_end_token_id``, ``video_start_token_id``,
            ``video_end_token_id``): routed to the vision experts like the placeholders. LLaVA
            data sets them to its tokenizer's vision start / end ids.
        init_from_hf: Hugging Face ERNIE-4.5-VL directory whose config.json decides the
            architecture and whose weights initialise the model.
    """

    video_layout: ClassVar[str] = "ernie4_5_vl"  # one run per video, a time step per frame pair

    encoder: ModelConfig = component("model", default_factory=_ernie_vit)
    projector: ModelConfig = component("model", default_factory=_resampler)
    foundation: ModelConfig = component("model", default_factory=_ernie_text)
    vision_start_token_ids: list[int] = field(default_factory=list)
    init_from_hf: Optional[str] = None

    @property
    def lora(self):
        """The foundation's LoRA settings (``loong convert`` and the trainer ask the model)."""
        return getattr(self.foundation, "lora", None)
