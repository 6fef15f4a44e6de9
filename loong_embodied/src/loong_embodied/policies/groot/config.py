"""Config of the GR00T-N1.6-style policy (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_embodied.policies.common.config import VLAConfig


@dataclass
class GrootConfig(VLAConfig):
    """VLM features (SigLIP + decoder, cut after ``num_layers`` layers: the "middle layer" GR00T
    reads) conditioning a DiT flow-matching action head.

    Attributes:
        tune_backbone: Train the vision tower, projector and language model too (GR00T trains
            only the action head by default: False freezes them, with DDP and FSDP2 alike).
        head_hidden_size: Width of the DiT and its encoders.
        head_layers: DiT blocks, alternating cross-attention to the VLM features (even) and
            self-attention over the state and action tokens (odd).
        head_heads: Attention heads of the DiT.
        time_embedding_dim: Sinusoidal timestep embedding width.
        noise_s: The ``s`` of GR00T's timestep distribution (flow times above ``s`` are not drawn).
    """

    tune_backbone: bool = False
    head_hidden_size: int = 1024
    head_layers: int = 16
    head_heads: int = 32
    time_embedding_dim: int = 256
    noise_s: float = 0.999
    num_inference_steps: int = 4
