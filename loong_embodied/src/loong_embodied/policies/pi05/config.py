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
        time_embedding_dim: Sinusoidal flow-time embedding width.
    """

    expert_hidden_size: int = 1024
    expert_intermediate_size: int = 4096
    state_bins: int = 256
    time_embedding_dim: int = 256
