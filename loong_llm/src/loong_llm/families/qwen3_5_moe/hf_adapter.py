"""HF <-> loong mapping of the Qwen3.5-MoE text family (``Qwen3_5MoeForCausalLM``)."""

from __future__ import annotations

from loong_llm.families.qwen3_next.hf_adapter import Qwen3NextHFAdapter


class Qwen3_5MoEHFAdapter(Qwen3NextHFAdapter):
    """Qwen3.5-MoE text checkpoints: Qwen3-Next's names, except the Gated DeltaNet input
    projections (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``)."""

    family = "qwen3_5_moe"
    model_types = ("qwen3_5_moe_text",)
    architecture = "Qwen3_5MoeForCausalLM"
    split_projections = True
    absent_keys = ("intermediate_size", "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob")

    def config_to_hf(self, cfg) -> dict:
        from loong_core.errors import ConfigError
        from loong_llm.families.common.moe import moe_layer_pattern

        if not all(moe_layer_pattern(cfg)) or cfg.moe_router_pre_softmax:
            raise ConfigError("a Qwen3.5-MoE checkpoint has MoE layers only, with renormalised top-k "
                              "weights: set model.moe_layer_freq=1 and model.moe_router_pre_softmax=false.")
        return super().config_to_hf(cfg)
