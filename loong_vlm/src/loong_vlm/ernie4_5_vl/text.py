"""ERNIE-4.5-VL's decoder as a loong foundation: loong_llm's MoE provider with the
modality-isolated MoE layer (:mod:`loong_vlm.ernie4_5_vl.moe`), the ERNIE router and 3D RoPE."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.moe import MoEProvider
from loong_vlm.ernie4_5_vl.config import ErnieVLTextConfig


class ErnieVLTextProvider(MoEProvider):
    """GQA attention without biases, interleaved-pair 3D RoPE, dense first layers, then
    ``ModalityMoELayer`` s (text / vision routers and experts, shared experts). The composer
    gives the layers each micro batch's vision-token mask."""

    family = "ernie4_5_vl"
    config: ErnieVLTextConfig

    def family_transformer_kwargs(self) -> dict[str, Any]:
        c = self.config
        if c.position_embedding_type != "mrope":
            raise ConfigError("model.foundation.position_embedding_type must be mrope for ernie4_5_vl_text "
                              "(ERNIE-4.5-VL's 3D RoPE).")
        return {**super().family_transformer_kwargs(), "rotary_interleaved": True,
                "moe_router_dtype": "fp32"}

    def megatron_config(self, parallel_kwargs: dict):
        config = super().megatron_config(parallel_kwargs)
        c = self.config
        config.vision_moe_ffn_hidden_size = (c.vision_moe_ffn_hidden_size or c.moe_ffn_hidden_size
                                             or c.resolved_ffn_hidden_size())
        return config

    def layer_spec(self, config, vp_stage):
        """megatron-core's MoE block spec with each MoE layer's MLP made modality-isolated."""
        from megatron.core.transformer.moe.moe_layer import MoELayer
        from megatron.core.transformer.spec_utils import ModuleSpec

        from loong_vlm.ernie4_5_vl.moe import ModalityMoELayer

        spec = super().layer_spec(config, vp_stage)
        for layer in spec.layer_specs:
            mlp = layer.submodules.mlp
            if isinstance(mlp, ModuleSpec) and mlp.module is MoELayer:
                layer.submodules.mlp = ModuleSpec(module=ModalityMoELayer, submodules=mlp.submodules)
        return spec

    def build_megatron_model(self, config, pre_process, post_process, vp_stage):
        """The model with ERNIE's 3D rotary embedding."""
        from loong_vlm.ernie4_5_vl.rope import ErnieMRoPE

        model = super().build_megatron_model(config, pre_process, post_process, vp_stage)
        model.rotary_pos_emb = ErnieMRoPE.replacing(model.rotary_pos_emb)
        return model

    def mlp_params_per_layer(self) -> float:
        return super().mlp_params_per_layer() + self.config.hidden_size * self.config.num_experts
