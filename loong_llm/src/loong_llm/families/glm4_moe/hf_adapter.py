"""HF <-> loong mapping of the GLM-4.5 / 4.6 family (``Glm4MoeForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter
from loong_llm.families.common.moe import deepseek_moe_from_hf, deepseek_moe_rules, deepseek_moe_to_hf


class Glm4MoEHFAdapter(DecoderHFAdapter):
    """GLM-4.5 checkpoints: Llama-layout attention with ``q/k/v_proj.bias`` (and ``q_norm`` /
    ``k_norm`` when ``use_qk_norm``), dense MLPs before ``first_k_dense_replace``, then
    ``mlp.gate`` (+ ``e_score_correction_bias``), ``mlp.experts.E`` and ``mlp.shared_experts``.

    The multi-token-prediction layer a published checkpoint carries after the last layer
    (``num_nextn_predict_layers``, stored as ``model.layers.{num_hidden_layers}.*``) is read
    into megatron-core's MTP block when its weights are there (``mtp_rules``).
    """

    family = "glm4_moe"
    model_types = ("glm4_moe",)
    architecture = "Glm4MoeForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        if not hf.get("norm_topk_prob", True):
            raise ConfigError("norm_topk_prob=false is not supported by the 'glm4_moe' family "
                              "(megatron-core's sigmoid router renormalises the top-k weights).")
        return {**super().config_from_hf(hf), "add_qkv_bias": bool(hf.get("attention_bias")),
                "qk_layernorm": bool(hf.get("use_qk_norm")), **deepseek_moe_from_hf(hf)}

    def config_to_hf(self, cfg) -> dict:
        return {**super().config_to_hf(cfg), "attention_bias": cfg.add_qkv_bias,
                "use_qk_norm": cfg.qk_layernorm, "head_dim": cfg.head_dim(),
                **deepseek_moe_to_hf(cfg)}

    def mlp_rules(self, cfg) -> list:
        return [*super().mlp_rules(cfg), *deepseek_moe_rules()]  # dense first layers, then MoE
