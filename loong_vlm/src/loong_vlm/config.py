"""Config classes of the VLM components (light: no torch import).

A VLM is three registered components, each with its own config picked by its ``name``:
``encoder`` (a vision encoder), ``projector`` (vision features -> foundation width) and
``foundation`` (any registered decoder model, for example loong_llm's ``llama`` or ``qwen3``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from loong_core.config.schema import ModelConfig, component


@dataclass
class VisionEncoderConfig(ModelConfig):
    """Base of every vision encoder config.

    Attributes:
        image_size: Side of the (square) input images in pixels; the dataset sets it.
        num_channels: Image channels (1 grey, 3 RGB); the dataset sets it.
        patch_size: Side of a square patch; the image is cut into ``(image_size / patch_size)^2``.
        freeze: Keep the encoder's weights fixed (no gradient, no optimizer update).
        tensor_model_parallel_size: The encoder's own tensor-parallel size; must divide the
            foundation's (``parallel.tensor_model_parallel_size``). None: the foundation's. 1: a
            whole encoder on every foundation-TP rank (``docs/vlm_parallelism.md``).
        data_layout: What the encoder replicas inside one foundation-TP group compute when the
            encoder's TP is narrower: ``replicate`` (each encodes every image) or ``shard`` (each
            encodes its share of the micro batch's images; features are all-gathered).
        recompute_granularity: The encoder's activation recompute, independent of the
            foundation's: None, ``full`` or ``selective`` (core attention).
        recompute_method: ``uniform`` or ``block`` (full recompute; None: uniform).
        recompute_num_layers: Layers per recompute unit (full recompute; None: 1).
    """

    image_size: int = 16
    num_channels: int = 3
    patch_size: int = 4
    freeze: bool = False
    tensor_model_parallel_size: Optional[int] = None
    data_layout: Literal["replicate", "shard"] = "replicate"
    recompute_granularity: Optional[Literal["full", "selective"]] = None
    recompute_method: Optional[Literal["uniform", "block"]] = None
    recompute_num_layers: Optional[int] = None

    def grid(self) -> tuple[int, int]:
        """Patches per column and per row."""
        if self.image_size % self.patch_size:
            raise ValueError(
                f"model.encoder.image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        side = self.image_size // self.patch_size
        return side, side

    def num_patches(self) -> int:
        """Feature vectors the encoder outputs per image."""
        rows, cols = self.grid()
        return rows * cols


@dataclass
class DynamicViTConfig(VisionEncoderConfig):
    """Base of the native-resolution vision towers (Qwen3-VL's, MoonViT, ERNIE-4.5-VL's): inputs
    are ``pixel_values`` rows with a ``[t, h, w]`` patch grid per image or video
    (``docs/vlm_inputs.md``), positions are 2D rotary embeddings, and ``spatial_merge_size^2``
    patches become one token of the foundation. ``image_size`` only sizes the fixed-resolution
    bookkeeping of the generic VLM provider.

    Attributes:
        num_layers: Transformer blocks (HF ``depth`` / ``num_hidden_layers``).
        hidden_size: Width.
        num_attention_heads: Heads (HF ``num_heads``); must divide by the TP size.
        ffn_hidden_size: MLP inner width (HF ``intermediate_size``).
        spatial_merge_size: Side of the block of patches merged into one output token.
        rope_theta: Base of the 2D rotary frequencies.
        norm_epsilon: LayerNorm epsilon.
        init_method_std: Std of the normal initialisation.
        hidden_dropout: Dropout after attention / MLP.
        attention_dropout: Dropout on attention probabilities.
    """

    dynamic_resolution: ClassVar[bool] = True  # pixel_values + grid_thw inputs (docs/vlm_inputs.md)

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0
    norm_epsilon: float = 1.0e-6
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0

    def num_patches(self) -> int:
        """Merged tokens of one ``image_size`` square image (after the merge)."""
        rows, cols = self.grid()
        return rows * cols // (self.spatial_merge_size ** 2)


@dataclass
class ViTConfig(VisionEncoderConfig):
    """A plain pre-norm ViT (SigLIP / InternViT style): linear patch embedding, learned absolute
    position embeddings, bidirectional attention, LayerNorm, GELU MLP with biases.

    Attributes:
        num_layers: Transformer layers.
        hidden_size: Width.
        num_attention_heads: Heads (must divide by the tensor-parallel size).
        ffn_hidden_size: MLP inner width; None means ``4 * hidden_size``.
        norm_epsilon: LayerNorm epsilon.
        init_method_std: Std of the normal initialisation.
        hidden_dropout: Dropout after attention / MLP.
        attention_dropout: Dropout on attention probabilities.
    """

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: Optional[int] = None
    norm_epsilon: float = 1.0e-6
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0


@dataclass
class Rope2DViTConfig(ViTConfig):
    """A Qwen2.5-VL-style ViT: no absolute position embeddings; 2D rotary embeddings (a quarter
    of each head's frequencies rotate with the patch row, a quarter with its column, each used
    twice as rotate-half pairs), RMSNorm and a SwiGLU MLP with biases. Window attention and
    dynamic resolution are not implemented yet. Pair it with the ``merger2x2`` projector for
    Qwen's 2x2 patch merger.

    Attributes:
        rope_theta: Base of the rotary frequencies.
    """

    rope_theta: float = 10000.0


@dataclass
class MLPProjectorConfig(ModelConfig):
    """Two-layer MLP from encoder features to the foundation's hidden size, optionally merging
    each ``spatial_merge_size x spatial_merge_size`` block of neighbouring patches into one token
    (concatenated before the MLP), which divides the image tokens by ``spatial_merge_size^2``.

    Attributes:
        ffn_hidden_size: Inner width; None means the foundation's hidden size.
        activation: ``gelu`` or ``silu``.
        spatial_merge_size: Side of the merged patch block (1: no merging); the merged vector
            holds the block's patches row by row (what InternVL's ``pixel_shuffle`` makes).
        pre_norm: LayerNorm before the MLP.
        norm_after_merge: The LayerNorm runs over the merged vector (InternVL) instead of over
            each patch before merging.
        norm_epsilon: The LayerNorm's epsilon.
        freeze: Keep the projector's weights fixed.
    """

    ffn_hidden_size: Optional[int] = None
    activation: Literal["gelu", "silu"] = "gelu"
    spatial_merge_size: int = 1
    pre_norm: bool = True
    norm_after_merge: bool = False
    norm_epsilon: float = 1.0e-6
    freeze: bool = False


@dataclass
class VLMConfig(ModelConfig):
    """Encoder + projector + foundation, composed at the image placeholder tokens.

    Attributes:
        encoder: Vision encoder config (``model.encoder.name`` picks the registered encoder).
        projector: Projector config (``model.projector.name``).
        foundation: Decoder config of any registered foundation model (``model.foundation.name``,
            for example ``llama`` or ``qwen3``); swap it with ``model@model.foundation=<option>``.
        image_token_id: Token id of the image placeholder; the dataset sets it.
        image_tokens: Placeholder tokens per image in the data; the dataset sets it and it must
            equal what encoder + projector produce per image (checked before building).
        freeze_foundation: Keep the foundation's weights fixed (train encoder / projector only).
        video_token_id: Token id of the video placeholder (Qwen-style ``pixel_values_videos``
            inputs); the dataset sets it. None: the model takes no videos.
    """

    encoder: ModelConfig = component("model")
    projector: ModelConfig = component("model")
    foundation: ModelConfig = component("model")
    image_token_id: Optional[int] = None
    image_tokens: Optional[int] = None
    freeze_foundation: bool = False
    video_token_id: Optional[int] = None

    def check(self, run, path: str) -> None:
        """The foundation's rules (heads / layers against the parallel sizes, sequence length)."""
        self.foundation.check(run, f"{path}.foundation")
