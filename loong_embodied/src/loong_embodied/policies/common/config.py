"""Config fields every vision-language-action policy shares (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_embodied.policies.shapes import PolicyShapesConfig


@dataclass
class VLAConfig(PolicyShapesConfig):
    """Shapes (the data fills them), the vision encoder, the language backbone and sampling.

    The backbone is built from transformers classes from these sizes (random weights): a SigLIP
    vision tower (``SiglipVisionModel``) whose patch features are projected into a decoder-only
    language model (``LlamaModel`` or ``Qwen2Model``).

    Attributes:
        state_dim: Proprioceptive state size.
        action_dim: Action size.
        chunk_size: Actions predicted per step (action chunking).
        n_obs_steps: Frames of state history (the policies read the current camera frame).
        image_size: ``[C, H, W]`` of the cameras.
        image_keys: Camera features read from the batch (one vision pass each, tokens concatenated).
        num_tasks: Tasks of the dataset (unused: the policies read the instruction text).
        patch_size: Vision patch side in pixels.
        vision_hidden_size: Width of the vision tower.
        vision_layers: Vision transformer layers.
        vision_heads: Vision attention heads.
        vision_intermediate_size: Vision MLP width.
        vision_merge: Eagle-style image tokens (GR00T's VLM): each ``vision_merge x vision_merge``
            block of neighbouring patches is concatenated into one token (pixel shuffle), which
            a LayerNorm + two-layer GELU MLP projects to the language width; ``vision_merge^2``
            times fewer image tokens. 1: one token per patch through a linear projection.
        backbone_type: Language model architecture: ``llama`` or ``qwen2``.
        hidden_size: Language model width.
        num_layers: Language model layers.
        num_heads: Attention heads of the language model.
        num_kv_heads: Key/value heads (grouped-query attention).
        head_dim: Width of one attention head.
        intermediate_size: Language model MLP width.
        max_text_tokens: Instruction tokens (UTF-8 bytes after a BOS; longer ones are cut).
        num_inference_steps: Euler steps from noise to actions at inference.
        action_clip: Sampled (normalised) actions are clipped to ``[-action_clip, action_clip]``
            (1.0 is the range of ``min_max`` normalisation); None: no clipping.
    """

    patch_size: int = 16
    vision_hidden_size: int = 768
    vision_layers: int = 12
    vision_heads: int = 12
    vision_intermediate_size: int = 3072
    vision_merge: int = 1
    backbone_type: str = "llama"
    hidden_size: int = 2048
    num_layers: int = 18
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    intermediate_size: int = 16384
    max_text_tokens: int = 48
    num_inference_steps: int = 10
    action_clip: Optional[float] = 1.0
