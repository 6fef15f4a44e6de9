"""Config of the Pi0.5-style policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_embodied.policies.common.config import VLAConfig


@dataclass
class Pi05Config(VLAConfig):
    """A VLM backbone (SigLIP + decoder) and an action expert of its own width, one layer per backbone layer.

    The expert uses the backbone's head layout (``num_heads``, ``num_kv_heads``, ``head_dim``) so
    its queries can attend to the backbone's keys and values at the same layer.

    Attributes:
        expert_hidden_size: Width of the action expert.
        expert_intermediate_size: MLP width of the action expert.
        state_bins: Bins of the discretised state tokens in the prompt (0: no state in the prompt): the
            current normalised state, clipped to [-1, 1] (normalise it with ``min_max``).
        state_token: Pi0's layout of the state instead of (or besides) Pi0.5's: the current
            normalised state, projected linearly to the expert width, as one continuous token at the
            head of the action suffix; it attends to the prefix and itself, the action tokens attend
            to it. Binned state tokens carry only ``state_bins`` levels per dimension, learnt from
            scratch on a small dataset; this token carries the exact values.
        time_embedding_dim: Sinusoidal flow-time embedding width.
    """

    expert_hidden_size: int = 1024
    expert_intermediate_size: int = 4096
    state_bins: int = 256
    state_token: bool = False
    time_embedding_dim: int = 256
