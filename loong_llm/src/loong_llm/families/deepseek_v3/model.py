"""The DeepSeek-V3 style family: megatron-core MLA and MoE on the local spec."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common import rope
from loong_llm.families.common.moe import MoEProvider
from loong_llm.families.deepseek_v3.config import DeepSeekV3Config


def _mla_without_te() -> None:
    """megatron-core 0.16's MLA module believes TransformerEngine is present whenever its TE
    extension module imports (which it does without TE, leaving ``TELinear = None``) and then
    fails on ``isinstance(..., None)``; tell it the truth when TE is not installed."""
    import importlib.util

    from megatron.core.transformer import multi_latent_attention

    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


class DeepSeekV3Provider(MoEProvider):
    """MLA attention (``linear_q_down_proj``/``linear_q_up_proj``/``linear_kv_down_proj``/
    ``linear_kv_up_proj`` with q/kv latent RMSNorms), dense first layers, shared + routed experts,
    sigmoid router with expert bias (updated from the per-step token counts, no aux loss)."""

    family = "deepseek_v3"
    config: DeepSeekV3Config

    def transformer_config_class(self):
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        return MLATransformerConfig

    def family_transformer_kwargs(self) -> dict[str, Any]:
        c = self.config
        return {**super().family_transformer_kwargs(), "q_lora_rank": c.q_lora_rank,
                "kv_lora_rank": c.kv_lora_rank, "qk_head_dim": c.qk_head_dim,
                "qk_pos_emb_head_dim": c.qk_pos_emb_head_dim, "v_head_dim": c.v_head_dim,
                "rotary_base": c.rotary_base, **self.rope_kwargs()}

    def rope_kwargs(self) -> dict[str, Any]:
        """MLA's RoPE fields: plain ``rope``, or megatron-core's ``yarn`` with transformers'
        values (its softmax scale gets ``mscale(factor, mscale_all_dim)^2`` as transformers'
        does; ``mscale`` is the one giving transformers' attention factor, see
        :func:`loong_llm.families.common.rope.mcore_mscale`)."""
        s = self.config.rope_scaling
        if s.rope_type == "default":
            return {"rope_type": "rope"}
        if s.rope_type != "yarn":
            raise ConfigError(f"'model.rope_scaling.rope_type' = {s.rope_type!r} is not supported "
                              f"by the '{self.family}' family (MLA). Choices: default, yarn.")
        all_dim = float(s.mscale_all_dim or 0.0)
        return {"rope_type": "yarn", "rotary_scaling_factor": s.factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
                "beta_fast": float(s.beta_fast or 32), "beta_slow": float(s.beta_slow or 1),
                "mscale": rope.mcore_mscale(s, all_dim), "mscale_all_dim": all_dim}

    def build_megatron_model(self, config, pre_process, post_process, vp_stage):
        """The model, with YaRN's ``truncate=false`` (unrounded correction range) given to each
        layer's rotary embedding (megatron-core's MLA does not pass it on)."""
        model = super().build_megatron_model(config, pre_process, post_process, vp_stage)
        if self.config.rope_scaling.rope_type == "yarn" and self.config.rope_scaling.truncate is False:
            from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
                YarnRotaryEmbedding,
            )

            for module in model.modules():
                if isinstance(module, YarnRotaryEmbedding):
                    module.correction_range_round_to_int = False
                    module.forward.cache_clear()
        return model

    def layer_spec(self, config, vp_stage):
        """The block spec with megatron-core's MLA, whose core attention is the kernel seam's
        (megatron-core's local ``DotProductAttention`` cannot take MLA's key/value widths)."""
        from loong_core.engines.megatron.seam.modules import SeamCoreAttention

        _mla_without_te()
        spec = super().layer_spec(config, vp_stage)
        for layer in spec.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = SeamCoreAttention
        return spec

    def attention_params_per_layer(self) -> float:
        c = self.config
        q_dim = c.num_attention_heads * (c.qk_head_dim + c.qk_pos_emb_head_dim)
        q = c.hidden_size * q_dim if not c.q_lora_rank else c.q_lora_rank * (c.hidden_size + q_dim)
        kv = (c.hidden_size * (c.kv_lora_rank + c.qk_pos_emb_head_dim)
              + c.kv_lora_rank * c.num_attention_heads * (c.qk_head_dim + c.v_head_dim))
        return q + kv + c.num_attention_heads * c.v_head_dim * c.hidden_size
