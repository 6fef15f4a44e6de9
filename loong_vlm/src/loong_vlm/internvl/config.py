"""Config classes of InternVL (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from loong_core.config.schema import ModelConfig, component
from loong_vlm.config import MLPProjectorConfig, ViTConfig, VLMConfig


@dataclass
class InternViTConfig(ViTConfig):
    """InternViT (InternVL's vision tower): a pre-norm ViT over fixed-size tiles with a class
    token (dropped from the features), learned absolute positions, a Conv2d patch embedding and a
    learned per-channel scale on each residual branch (layer scale).

    Attributes:
        normalization: ``LayerNorm`` (InternViT-300M) or ``RMSNorm`` (InternViT-6B; HF ``norm_type``).
        qk_layernorm: RMSNorm over the whole query and key projections (all heads together;
            InternViT-6B, HF ``use_qk_norm``).
        layer_scale_init: Initial value of the residual-branch scales (HF ``layer_scale_init_value``).
        final_layernorm: A LayerNorm (whatever ``normalization`` is) after the last block (HF
            ``use_mean_pooling: false``).
        attention_bias: Biases on the query / key / value projections (HF ``attention_bias``;
            InternViT-300M has them, InternViT-6B not); the output projection and the MLP always
            have biases.
    """

    image_size: int = 448
    patch_size: int = 14
    num_layers: int = 24
    hidden_size: int = 1024
    num_attention_heads: int = 16
    ffn_hidden_size: Optional[int] = 4096
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    qk_layernorm: bool = False
    layer_scale_init: float = 0.1
    final_layernorm: bool = False
    attention_bias: bool = True


def _internvit() -> InternViTConfig:
    return InternViTConfig(name="internvit")


def _pixel_shuffle_mlp() -> MLPProjectorConfig:
    return MLPProjectorConfig(name="mlp_projector", spatial_merge_size=2, norm_after_merge=True,
                              norm_epsilon=1e-5)


def _qwen2_text() -> ModelConfig:
    from loong_llm.families.qwen2.config import Qwen2Config

    return Qwen2Config(name="qwen2")


@dataclass
class InternVLConfig(VLMConfig):
    """InternVL: ``internvit`` tiles, InternVL's projector (``mlp_projector`` merging each 2x2
    block of patches, transformers' ``pixel_shuffle`` with ``downsample_ratio`` 0.5, then
    LayerNorm over the merged vector and a GELU MLP) and any decoder foundation (Qwen2.5 for
    InternVL 2.5 / 3, Qwen3 for InternVL 3.5).

    Attributes:
        encoder: The vision tower (``internvit``).
        projector: ``mlp_projector`` with ``spatial_merge_size: 2`` and ``norm_after_merge``.
        foundation: Any registered decoder (``qwen2``, ``qwen3``, ``llama``...).
        init_from_hf: Hugging Face InternVL directory (``InternVLForConditionalGeneration``) whose
            config.json decides the architecture and whose weights initialise the model.
    """

    encoder: ModelConfig = component("model", default_factory=_internvit)
    projector: ModelConfig = component("model", default_factory=_pixel_shuffle_mlp)
    foundation: ModelConfig = component("model", default_factory=_qwen2_text)
    init_from_hf: Optional[str] = None

    @property
    def lora(self):
        """The foundation's LoRA settings (``loong convert`` and the trainer ask the model)."""
        return getattr(self.foundation, "lora", None)
