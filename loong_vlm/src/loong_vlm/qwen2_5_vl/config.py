"""Configs of Qwen2.5-VL: its vision tower, its patch merger and the composed model (light)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from loong_core.config.schema import ModelConfig
from loong_llm.families.qwen2.config import Qwen2Config
from loong_vlm.config import VisionEncoderConfig, VLMConfig


@dataclass
class Qwen25ViTConfig(VisionEncoderConfig):
    """The Qwen2.5-VL vision tower: dynamic resolution (images of any size, videos), patch
    embedding over ``temporal_patch_size`` frames, 2D RoPE in merge-block patch order, window
    attention with a few full-attention layers, RMSNorm and a SwiGLU MLP with biases.

    Inputs are Qwen-style (``pixel_values`` + ``image_grid_thw``, see ``docs/vlm_inputs.md``);
    ``image_size`` is only the nominal image side used for FLOP accounting.

    Attributes:
        num_layers: Transformer layers (HF ``depth``).
        hidden_size: Width.
        num_attention_heads: Heads (HF ``num_heads``; must divide by the tensor-parallel size).
        ffn_hidden_size: SwiGLU inner width (HF ``intermediate_size``).
        temporal_patch_size: Frames per patch (an image is repeated to fill them).
        spatial_merge_size: Side of the patch block the merger turns into one token.
        window_size: Side of an attention window in pixels.
        fullatt_block_indexes: Layers (0-based) that attend over the whole image / frame.
        tokens_per_second: Video time positions per second (MRoPE ids; data side).
        norm_epsilon: RMSNorm epsilon.
        rope_theta: Base of the 2D rotary frequencies.
        init_method_std: Std of the normal initialisation.
        hidden_dropout: Dropout after attention / MLP.
        attention_dropout: Dropout on attention probabilities.
    """

    dynamic_resolution: ClassVar[bool] = True

    image_size: int = 448
    patch_size: int = 14
    num_layers: int = 32
    hidden_size: int = 1280
    num_attention_heads: int = 16
    ffn_hidden_size: int = 3420
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: list[int] = field(default_factory=lambda: [7, 15, 23, 31])
    tokens_per_second: int = 2
    norm_epsilon: float = 1.0e-6
    rope_theta: float = 10000.0
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0

    def patch_dim(self) -> int:
        """Values of one flattened patch: ``channels * temporal_patch_size * patch_size^2``."""
        return self.num_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclass
class Qwen25MergerConfig(ModelConfig):
    """Qwen2.5-VL's patch merger: RMSNorm over each patch, then each block of
    ``spatial_merge_size^2`` consecutive patches (one 2x2 block in merge order) concatenated and
    passed through Linear -> GELU -> Linear to the foundation's width. With a LayerNorm it is
    Kimi-K2.5's projector.

    Attributes:
        spatial_merge_size: Side of the merged block (must equal the encoder's).
        normalization: ``RMSNorm`` (Qwen2.5-VL) or ``LayerNorm`` (Kimi-K2.5, with a bias).
        norm_epsilon: Epsilon of the norm.
        freeze: Keep the merger's weights fixed.
    """

    spatial_merge_size: int = 2
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    norm_epsilon: float = 1.0e-6
    freeze: bool = False


def _qwen2_5_vl_foundation() -> Qwen2Config:
    return Qwen2Config(name="qwen2", position_embedding_type="mrope", mrope_section=[16, 24, 24])


@dataclass
class Qwen25VLConfig(VLMConfig):
    """Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): the ``qwen2_5_vit`` tower, the
    ``qwen2_5_merger`` and a Qwen2.5 decoder with MRoPE. Fields: :class:`~loong_vlm.config.VLMConfig`.

    Attributes:
        init_from_hf: Hugging Face Qwen2.5-VL directory (config.json + safetensors) whose weights
            initialise the whole model (vision tower included) at the start of the run; its
            architecture fields override these.
    """

    encoder: Qwen25ViTConfig = field(default_factory=lambda: Qwen25ViTConfig(name="qwen2_5_vit"))
    projector: Qwen25MergerConfig = field(default_factory=lambda: Qwen25MergerConfig(name="qwen2_5_merger"))
    foundation: Qwen2Config = field(default_factory=_qwen2_5_vl_foundation)
    init_from_hf: Optional[str] = None
