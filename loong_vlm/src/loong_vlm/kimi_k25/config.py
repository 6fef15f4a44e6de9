"""Config classes of Kimi-K2.5 (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from loong_core.config.schema import ModelConfig, component
from loong_vlm.config import DynamicViTConfig, VLMConfig


@dataclass
class MoonViTConfig(DynamicViTConfig):
    """MoonViT (Kimi-VL / Kimi-K2.5's vision tower): native-resolution patches (Conv2d
    embedding), a learned ``position_grid x position_grid`` position table resampled bicubically
    to each image's patch grid plus a sinusoid per video frame, LayerNorm / GELU blocks with 2D
    RoPE (each rotated pair alternates column and row frequencies) and attention over a whole clip
    (all frames of a video chunk together), a final LayerNorm, and the frames of a clip averaged
    per patch. The output is one feature per patch of a frame, in merge-block order, for a
    ``qwen2_5_merger``-style projector.

    Inputs follow the dynamic-resolution convention (``docs/vlm_inputs.md``) with one frame per
    patch row (``C * patch_size^2`` values) and ``[t, h, w]`` grids whose ``t`` frames form one
    clip (at most ``num_frame_embeddings``).

    Attributes (besides :class:`~loong_vlm.config.DynamicViTConfig`'s; ``num_layers`` is HF
    ``num_hidden_layers``, ``spatial_merge_size`` HF ``merge_kernel_size``):
        hidden_act: MLP activation: ``gelu_pytorch_tanh`` or ``gelu``.
        position_grid: Side of the learned position table (HF ``pos_emb_height`` = ``pos_emb_width``).
        num_frame_embeddings: Frames of the temporal sinusoid table (HF ``pos_emb_time``): the
            most frames of one clip.
    """

    image_processing: ClassVar[str] = "navit"  # the preprocessing it reads (the data checks it)

    patch_size: int = 14
    norm_epsilon: float = 1.0e-5
    hidden_act: Literal["gelu_pytorch_tanh", "gelu"] = "gelu_pytorch_tanh"
    position_grid: int = 64
    num_frame_embeddings: int = 4


def _moonvit() -> MoonViTConfig:
    return MoonViTConfig(name="moonvit")


def _layernorm_merger() -> ModelConfig:
    from loong_vlm.qwen2_5_vl.config import Qwen25MergerConfig

    return Qwen25MergerConfig(name="qwen2_5_merger", normalization="LayerNorm", norm_epsilon=1e-5)


def _deepseek_v3_text() -> ModelConfig:
    from loong_llm.families.deepseek_v3.config import DeepSeekV3Config

    return DeepSeekV3Config(name="deepseek_v3")


@dataclass
class KimiK25Config(VLMConfig):
    """Kimi-K2.5 (``Kimi_K25ForConditionalGeneration``): the ``moonvit`` tower, its projector
    (``qwen2_5_merger`` with a LayerNorm: LayerNorm per patch, each 2x2 block concatenated,
    Linear -> GELU -> Linear) and a DeepSeek-V3 foundation (MLA, routed + shared experts) with
    plain 1D positions. Video chunks (up to ``num_frame_embeddings`` frames) are averaged into one
    frame's tokens each.

    Attributes:
        encoder: The vision tower (``moonvit``).
        projector: ``qwen2_5_merger`` with ``normalization: LayerNorm``.
        foundation: A ``deepseek_v3`` decoder (any decoder without MRoPE composes).
        init_from_hf: Hugging Face Kimi-K2.5 directory (``Kimi_K25ForConditionalGeneration``)
            whose config.json decides the architecture and whose weights initialise the model.
    """

    video_layout: ClassVar[str] = "kimi_k25"  # chunks of frames, one timestamp each

    encoder: ModelConfig = component("model", default_factory=_moonvit)
    projector: ModelConfig = component("model", default_factory=_layernorm_merger)
    foundation: ModelConfig = component("model", default_factory=_deepseek_v3_text)
    init_from_hf: Optional[str] = None

    @property
    def lora(self):
        """The foundation's LoRA settings (``loong convert`` and the trainer ask the model)."""
        return getattr(self.foundation, "lora", None)
