"""InternViT on megatron-core layers: Conv2d patches, a class token, learned absolute positions,
pre-norm blocks (LayerNorm or RMSNorm, optional whole-projection q/k RMSNorm) whose two residual
branches are each scaled by a learned per-channel vector (layer scale)."""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule

from loong_core.errors import ConfigError
from loong_vlm.encoders.spec import bidirectional_layer_spec, encoder_transformer_config
from loong_vlm.internvl.config import InternViTConfig


def _scale_branch(module, inputs, output):
    """Forward hook: a ``(output, bias)`` linear's result times its ``layer_scale``."""
    out, bias = output
    return out * module.layer_scale, None if bias is None else bias * module.layer_scale


def add_layer_scale(linear: torch.nn.Module, width: int, init: float) -> None:
    """Give ``linear`` (a residual branch's last megatron-core linear, which returns ``(output,
    bias)`` for the bias-dropout-add) a ``layer_scale`` parameter that multiplies its output and
    bias: the branch becomes ``residual + layer_scale * branch`` (replicated over TP: the output is
    whole after the row-parallel reduction)."""
    linear.layer_scale = torch.nn.Parameter(torch.full((width,), float(init)))
    linear.register_forward_hook(_scale_branch)


def internvit_layer_spec(cfg: InternViTConfig):
    """The bidirectional encoder layer with InternViT's norm and, optionally, q/k norms over the
    whole projection (loong_llm's :class:`ProjectionRMSNorm`, TP-sharded by heads)."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = bidirectional_layer_spec(normalization=cfg.normalization)
    if cfg.qk_layernorm:
        from loong_llm.families.minimax_m2.projection_norm import KEY, QUERY, ProjectionRMSNorm

        attention = spec.submodules.self_attention.submodules
        attention.q_layernorm = ModuleSpec(module=ProjectionRMSNorm, params={"projection": QUERY})
        attention.k_layernorm = ModuleSpec(module=ProjectionRMSNorm, params={"projection": KEY})
    return spec


class InternViTEncoder(MegatronModule):
    """Features ``[N, T, hidden]`` of fixed-size tiles ``[N, C, H, W]`` (the class token dropped).

    Args:
        cfg: Encoder config.
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields.

    Attributes:
        output_size: Width of the features.
        grid: Patches per column and row of one tile.
    """

    def __init__(self, cfg: InternViTConfig, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_block import TransformerBlock

        config = encoder_transformer_config(cfg, parallel_kwargs, normalization=cfg.normalization)
        super().__init__(config=config)
        if cfg.num_attention_heads % config.tensor_model_parallel_size:
            raise ConfigError(f"model.encoder.num_attention_heads={cfg.num_attention_heads} must be divisible "
                              f"by the encoder's tensor-parallel size {config.tensor_model_parallel_size}.")
        self.cfg = cfg
        self.output_size = cfg.hidden_size
        self.grid = cfg.grid()
        h = cfg.hidden_size
        self.patch_embed = torch.nn.Conv2d(cfg.num_channels, h, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, h))
        self.position_embeddings = torch.nn.Parameter(torch.empty(1, cfg.num_patches() + 1, h))
        with torch.no_grad():
            config.init_method(self.patch_embed.weight)
            self.patch_embed.bias.zero_()
            config.init_method(self.cls_token)
            config.init_method(self.position_embeddings)
        self.blocks = TransformerBlock(config=config, spec=internvit_layer_spec(cfg), post_layer_norm=False)
        # a LayerNorm whatever the blocks' normalization (transformers' InternVLVisionModel)
        self.final_layernorm = torch.nn.LayerNorm(h, eps=cfg.norm_epsilon) if cfg.final_layernorm else None
        for layer in self.blocks.layers:
            if not cfg.attention_bias:  # megatron-core gives every linear a bias or none
                layer.self_attention.linear_qkv.bias = None
            add_layer_scale(layer.self_attention.linear_proj, h, cfg.layer_scale_init)
            add_layer_scale(layer.mlp.linear_fc2, h, cfg.layer_scale_init)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Features ``[N, T, hidden]`` of tiles ``[N, C, H, W]`` (T = patches per tile)."""
        expected = (self.cfg.num_channels, self.cfg.image_size, self.cfg.image_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"tiles have shape {tuple(images.shape[1:])}, the encoder expects {expected} "
                             f"(model.encoder.num_channels / image_size)")
        x = self.patch_embed(images.to(self.patch_embed.weight.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position_embeddings
        x = self.blocks(x.transpose(0, 1).contiguous(), attention_mask=None)  # [1 + T, N, h]
        if self.final_layernorm is not None:
            x = self.final_layernorm(x)
        return x[1:].transpose(0, 1)
