"""Config of the Wan family: diffusers' ``WanTransformer3DModel`` arguments, same names (light)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from loong_diffusion.config import DiffusionModelConfig


@dataclass
class WanConfig(DiffusionModelConfig):
    """Wan video transformer. Fields other than ``pretrained`` and the base class's are passed to
    ``WanTransformer3DModel`` unchanged (see its documentation).

    Attributes:
        pretrained: A diffusers directory (``config.json`` + safetensors, e.g. the ``transformer``
            folder of a Wan pipeline) to load instead of initialising randomly.
        patch_size: ``[t, h, w]`` patch of the latent video.
        num_attention_heads: Heads.
        attention_head_dim: Head width.
        in_channels: Latent channels in.
        out_channels: Latent channels out.
        text_dim: Width of the text encoder's embeddings (umT5: 4096).
        freq_dim: Sinusoidal timestep embedding width.
        ffn_dim: Feed-forward width.
        num_layers: Transformer blocks.
        cross_attn_norm: Norm before cross-attention.
        qk_norm: Query/key normalisation.
        eps: Norm epsilon.
        image_dim: Image-embedding width (I2V models), or None.
        added_kv_proj_dim: Extra key/value projection width (I2V models), or None.
        rope_max_seq_len: RoPE table length.
        pos_embed_seq_len: Learned positional embedding length, or None.
    """

    pretrained: Optional[str] = None
    patch_size: list[int] = field(default_factory=lambda: [1, 2, 2])
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    qk_norm: Optional[str] = "rms_norm_across_heads"
    eps: float = 1.0e-6
    image_dim: Optional[int] = None
    added_kv_proj_dim: Optional[int] = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: Optional[int] = None

    def ulysses_heads(self) -> int:
        """Heads that ``parallel.ulysses_size`` must divide (declares Ulysses support)."""
        return self.num_attention_heads
