"""Vision tower and language model built from transformers classes from a :class:`VLAConfig`."""

from __future__ import annotations

import torch
from torch import nn

from loong_core.errors import ConfigError, MissingDependencyError
from loong_core.patches import merge_patches
from loong_embodied.policies.common.config import VLAConfig

BACKBONES = ("llama", "qwen2")


def _transformers():
    """transformers, or a clear error naming the extra that installs it."""
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError("transformers", "loong-embodied[vla]",
                                     "The pi05 / groot policies' backbone") from exc
    return transformers


def language_config(c: VLAConfig, vocab: int, num_layers: int, attn_implementation: str = "sdpa"):
    """The transformers config of the language model (``backbone_type``) at ``num_layers`` layers."""
    if c.backbone_type not in BACKBONES:
        raise ConfigError(f"model.backbone_type='{c.backbone_type}' is not supported; choose one of "
                          f"{', '.join(BACKBONES)}")
    if c.num_heads % c.num_kv_heads:
        raise ConfigError(f"model.num_heads ({c.num_heads}) must be a multiple of model.num_kv_heads "
                          f"({c.num_kv_heads})")
    transformers = _transformers()
    cls = transformers.LlamaConfig if c.backbone_type == "llama" else transformers.Qwen2Config
    config = cls(vocab_size=vocab, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                 num_hidden_layers=num_layers, num_attention_heads=c.num_heads,
                 num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, max_position_embeddings=4096,
                 tie_word_embeddings=False)
    config._attn_implementation = attn_implementation
    return config


def build_language_model(c: VLAConfig, vocab: int, num_layers: int, attn_implementation: str = "sdpa") -> nn.Module:
    """A randomly initialised ``LlamaModel`` / ``Qwen2Model`` (no LM head)."""
    transformers = _transformers()
    config = language_config(c, vocab, num_layers, attn_implementation)
    cls = transformers.LlamaModel if c.backbone_type == "llama" else transformers.Qwen2Model
    return cls(config)


class VisionEncoder(nn.Module):
    """SigLIP vision tower + a projection of its patch features to the language width: linear, or
    with ``vision_merge > 1`` Eagle's pixel shuffle (each block of patches into one token) and
    LayerNorm + GELU MLP."""

    def __init__(self, c: VLAConfig):
        super().__init__()
        transformers = _transformers()
        if not c.image_keys or not c.image_size:
            raise ConfigError("this policy reads camera images but the data gives none: use a dataset with an "
                              "image feature (data.image_keys=[observation.image]) or model=flow_policy")
        channels, height, width = c.image_size
        if height != width or height % c.patch_size:
            raise ConfigError(f"model.patch_size={c.patch_size} must divide the square image side "
                              f"(image_size={c.image_size})")
        config = transformers.SiglipVisionConfig(
            hidden_size=c.vision_hidden_size, intermediate_size=c.vision_intermediate_size,
            num_hidden_layers=c.vision_layers, num_attention_heads=c.vision_heads, num_channels=channels,
            image_size=height, patch_size=c.patch_size, vision_use_head=False)
        self.tower = transformers.SiglipVisionModel(config)
        self.grid, self.merge = (height // c.patch_size, width // c.patch_size), c.vision_merge
        if self.merge < 1 or self.grid[0] % self.merge:
            raise ConfigError(f"model.vision_merge={c.vision_merge} must divide the {self.grid[0]}x{self.grid[1]} "
                              f"patch grid (image side {height} / patch_size {c.patch_size})")
        if self.merge == 1:
            self.projector = nn.Linear(c.vision_hidden_size, c.hidden_size)
        else:
            merged = c.vision_hidden_size * self.merge ** 2
            self.projector = nn.Sequential(nn.LayerNorm(merged), nn.Linear(merged, c.hidden_size), nn.GELU(),
                                           nn.Linear(c.hidden_size, c.hidden_size))
        self.keys = list(c.image_keys)

    def blocks(self) -> list[nn.Module]:
        """The tower's transformer layers (FSDP2 units)."""
        return list(self.tower.encoder.layers)

    def forward(self, batch: dict) -> torch.Tensor:
        """Image tokens ``[B, cameras * patches, hidden]`` of the current frame of every camera."""
        tokens = []
        for key in self.keys:
            image = batch[key].float()
            if image.dim() == 5:                       # [B, T, C, H, W]: the current frame
                image = image[:, -1]
            features = self.tower(pixel_values=image * 2.0 - 1.0).last_hidden_state
            tokens.append(self.projector(merge_patches(features, self.grid, self.merge)))
        return torch.cat(tokens, dim=1)
