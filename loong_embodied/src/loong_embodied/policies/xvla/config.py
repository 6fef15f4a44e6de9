"""Config of the X-VLA-style policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_embodied.policies.common.config import VLAConfig


@dataclass
class XVLAConfig(VLAConfig):
    """VLM features (SigLIP + decoder) read by X-VLA's soft-prompted transformer, laid out as
    LeRobot 0.4.4's ``xvla`` (``SoftPromptedTransformer``, action space ``auto``).

    Attributes:
        tune_backbone: Train the vision tower, projector and language model too (X-VLA trains
            everything by default; False freezes them).
        head_hidden_size: Width of the soft-prompted transformer (X-VLA's ``hidden_size``).
        head_layers: Its transformer blocks (X-VLA's ``depth``).
        head_heads: Its attention heads (X-VLA's ``num_heads``).
        mlp_ratio: MLP width of a block over ``head_hidden_size``.
        dropout: Dropout of the attention probabilities and the MLP activations while training
            (X-VLA's blocks hard-code 0.1).
        num_domains: Embodiments / domains with their own soft prompts, action encoder and decoder.
        domain_id: The domain of every sample when the batch has no ``domain_id``.
        soft_prompt_len: Learned prompt tokens per domain appended to the sequence (0: none).
        time_embedding_dim: Width of the ``[cos, sin]`` flow-time embedding (max period 100).
        max_seq_len: Rows of the learned positions (actions + VLM tokens + auxiliary view tokens).
        max_state_dim: The state is zero-padded to this size (X-VLA's ``max_state_dim``).
        max_action_dim: The network's action width; actions are zero-padded to it and the loss
            reads the first ``action_dim`` (X-VLA's ``auto`` action space, ``max_action_dim``).
        hetero_projection: Per-domain projections of the VLM and auxiliary view tokens
            (X-VLA's ``use_hetero_proj``).
    """

    tune_backbone: bool = True
    head_hidden_size: int = 1024
    head_layers: int = 24
    head_heads: int = 16
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    num_domains: int = 30
    domain_id: int = 0
    soft_prompt_len: int = 32
    time_embedding_dim: int = 32
    max_seq_len: int = 512
    max_state_dim: int = 32
    max_action_dim: int = 20
    hetero_projection: bool = False
