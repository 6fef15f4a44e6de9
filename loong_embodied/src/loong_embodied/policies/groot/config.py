"""Config of the GR00T-style policy, N1.5 and N1.6 layouts (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from loong_embodied.policies.common.config import VLAConfig


@dataclass
class GrootConfig(VLAConfig):
    """VLM features (SigLIP + decoder, cut after ``num_layers`` layers: the "middle layer" GR00T
    reads) conditioning a DiT flow-matching action head laid out as GR00T N1.5's in LeRobot 0.4.4;
    ``model=groot_n16`` sets GR00T N1.6's layout (no VL self-attention blocks, no future tokens,
    the DiT alternating text and image cross-attention, the top backbone layers trained).

    Attributes:
        tune_backbone: Train the vision tower, projector and language model too (GR00T trains
            only the action head by default: False freezes them, with DDP and FSDP2 alike).
        head_hidden_size: Width of the DiT and its encoders.
        head_layers: DiT blocks, alternating cross-attention to the VLM features (even) and
            self-attention over the state, future and action tokens (odd).
        head_heads: Attention heads of the DiT.
        time_embedding_dim: Sinusoidal timestep embedding width (the DiT's timestep input).
        noise_s: The ``s`` of GR00T's timestep distribution (flow times above ``s`` are not drawn).
        timestep_buckets: The network sees the integer step ``floor((1 - t) * timestep_buckets)``.
        future_tokens: Learned tokens between the state token and the action tokens (GR00T's
            ``num_target_vision_tokens``).
        vl_layers: Self-attention blocks over the normalised VLM features before the DiT reads
            them (GR00T's ``vl_self_attention``; 0: none).
        vl_heads: Attention heads of those blocks (they must divide ``hidden_size``).
        num_embodiments: Embodiments the head serves: the state encoder, action encoder and action
            decoder hold one set of weights per embodiment (GR00T's category-specific layers).
        embodiment_id: The embodiment of batches without an ``embodiment_id`` entry.
        attend_text_every: GR00T N1.6's ``AlternateVLDiT``: cross-attention block ``i`` reads only
            the text tokens when ``i % (2 * attend_text_every) == 0``, only the image tokens
            otherwise (0: every cross-attention block reads every token, as N1.5).
        tune_top_llm_layers: With ``tune_backbone=false``, train the language model's last this-many
            layers and its final norm anyway (N1.6 trains the top 4).
        state_dropout_prob: GR00T N1.6's state dropout: in training, each sample's encoded state
            token is replaced by a learned mask token with this probability (the policy learns to
            act without the state too); never at inference.
        state_noise_scale: GR00T N1.6's additive state noise: in training, Gaussian noise of this
            standard deviation is added to the encoded state token; never at inference.
    """

    tune_backbone: bool = False
    head_hidden_size: int = 1024
    head_layers: int = 16
    head_heads: int = 32
    time_embedding_dim: int = 256
    noise_s: float = 0.999
    timestep_buckets: int = 1000
    future_tokens: int = 32
    vl_layers: int = 4
    vl_heads: int = 16
    num_embodiments: int = 1
    embodiment_id: int = 0
    attend_text_every: int = 0
    tune_top_llm_layers: int = 0
    state_dropout_prob: float = 0.0
    state_noise_scale: float = 0.0
    num_inference_steps: int = 4
