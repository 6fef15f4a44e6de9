"""HF <-> loong mapping of the Qwen3-MoE family (``Qwen3MoeForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter
from loong_llm.families.common.moe import expert_rules, moe_layer_pattern


class Qwen3MoEHFAdapter(DecoderHFAdapter):
    """Qwen3-MoE checkpoints: Qwen3 attention, ``mlp.gate`` router, ``mlp.experts.E.*`` experts;
    layers in ``mlp_only_layers`` (or off ``decoder_sparse_step``) keep a dense MLP."""

    family = "qwen3_moe"
    model_types = ("qwen3_moe",)
    architecture = "Qwen3MoeForCausalLM"
    aliases = {"num_experts": "num_local_experts"}

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("attention_bias") or hf.get("use_sliding_window"):
            raise ConfigError("attention_bias / use_sliding_window are not supported by the "
                              "'qwen3_moe' family.")
        layers = hf["num_hidden_layers"]
        step = hf.get("decoder_sparse_step", 1) or 1
        dense = set(hf.get("mlp_only_layers") or [])
        experts = hf.get("num_experts") or hf.get("num_local_experts")
        pattern = [0 if (i in dense or (i + 1) % step) else 1 for i in range(layers)]
        return {
            **super().config_from_hf(hf), "add_qkv_bias": False, "qk_layernorm": True,
            "num_experts": experts, "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", False),
            "moe_router_score_function": "softmax",
            "moe_aux_loss_coeff": hf.get("router_aux_loss_coef", 1e-3),
            "moe_layer_freq": 1 if all(pattern) else pattern,
        }

    def config_to_hf(self, cfg) -> dict:
        pattern = moe_layer_pattern(cfg)
        return {
            **super().config_to_hf(cfg), "attention_bias": False, "use_sliding_window": False,
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.moe_router_topk,
            "moe_intermediate_size": cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size(),
            "norm_topk_prob": not cfg.moe_router_pre_softmax,
            "router_aux_loss_coef": cfg.moe_aux_loss_coeff, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, moe in enumerate(pattern) if not moe],
        }

    def rules(self, cfg) -> list:
        return [*super().rules(cfg), *expert_rules()]
