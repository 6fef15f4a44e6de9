"""Config classes of Qwen3-VL (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from loong_core.config.schema import ModelConfig, component
from loong_vlm.config import DynamicViTConfig, VLMConfig


@dataclass
class Qwen3ViTConfig(DynamicViTConfig):
    """The Qwen3-VL vision tower: dynamic-resolution patches (Conv3d embedding over
    ``temporal_patch_size`` frames), learned position embeddings bilinearly resampled to each
    image's patch grid, 2D rotary embeddings, LayerNorm + GELU MLP blocks with biases, a
    ``spatial_merge_size^2`` patch merger to the foundation's width and one more merger per
    deepstack layer.

    Inputs follow transformers' Qwen2-VL image processor: patches of all images concatenated,
    each image's patches in merge-block order, with a ``[t, h, w]`` patch grid per image.

    Attributes (besides :class:`~loong_vlm.config.DynamicViTConfig`'s):
        hidden_act: MLP activation (HF ``hidden_act``): ``gelu_pytorch_tanh`` or ``gelu``.
        temporal_patch_size: Frames per patch (images are repeated to fill it).
        out_hidden_size: Width of the merged tokens (the foundation's hidden size).
        num_position_embeddings: Rows of the learned position table (a square grid).
        deepstack_visual_indexes: Blocks after which features are taken, merged and added to
            the hidden states of the first decoder layers (one decoder layer per index).
    """

    patch_size: int = 16
    hidden_act: Literal["gelu_pytorch_tanh", "gelu"] = "gelu_pytorch_tanh"
    temporal_patch_size: int = 2
    out_hidden_size: int = 64
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: list[int] = field(default_factory=list)


@dataclass
class IdentityProjectorConfig(ModelConfig):
    """No projector: the encoder already outputs the foundation's width (``qwen3_vit`` holds
    its patch merger).

    Attributes:
        freeze: Unused (nothing to train); kept for the common projector interface.
    """

    freeze: bool = False


def _qwen3_vit() -> Qwen3ViTConfig:
    return Qwen3ViTConfig(name="qwen3_vit")


def _identity() -> IdentityProjectorConfig:
    return IdentityProjectorConfig(name="identity")


def _qwen3_text() -> ModelConfig:
    from loong_llm.families.qwen3.config import Qwen3Config

    return Qwen3Config(name="qwen3", position_embedding_type="mrope", mrope_section=[24, 20, 20])


@dataclass
class Qwen3VLConfig(VLMConfig):
    """Qwen3-VL: the ``qwen3_vit`` tower (merger and deepstack mergers included), no separate
    projector, and a Qwen3 dense foundation with interleaved MRoPE; the encoder's deepstack
    features are added to the outputs of the first decoder layers.

    Attributes:
        encoder: The vision tower (``qwen3_vit``).
        projector: ``identity`` (the tower's merger already projects).
        foundation: A ``qwen3`` decoder with ``position_embedding_type: mrope``.
        mrope_interleaved: Interleave the time / height / width rotary frequencies (Qwen3-VL);
            False keeps megatron-core's contiguous sections (Qwen2-VL).
        init_from_hf: Hugging Face Qwen3-VL directory (``Qwen3VLForConditionalGeneration``) whose
            config.json decides the architecture and whose weights initialise the model.
    """

    video_layout: ClassVar[str] = "qwen3_vl"  # timestamped frames (loong_vlm.data.video_layout)

    encoder: ModelConfig = component("model", default_factory=_qwen3_vit)
    projector: ModelConfig = component("model", default_factory=_identity)
    foundation: ModelConfig = component("model", default_factory=_qwen3_text)
    mrope_interleaved: bool = True
    init_from_hf: Optional[str] = None

    @property
    def lora(self):
        """The foundation's LoRA settings (``loong convert`` and the trainer ask the model)."""
        return getattr(self.foundation, "lora", None)


def _qwen3_moe_text() -> ModelConfig:
    from loong_llm.families.qwen3_moe.config import Qwen3MoEConfig

    return Qwen3MoEConfig(name="qwen3_moe", position_embedding_type="mrope", mrope_section=[24, 20, 20])


@dataclass
class Qwen3VLMoeConfig(Qwen3VLConfig):
    """Qwen3-VL-MoE: Qwen3-VL with a ``qwen3_moe`` foundation (every layer MoE, top-k softmax
    router renormalised, expert parallel); ``init_from_hf`` reads a
    ``Qwen3VLMoeForConditionalGeneration`` directory."""

    foundation: ModelConfig = component("model", default_factory=_qwen3_moe_text)
