"""HF <-> loong mapping of the MiniMax-M2 family (``MiniMaxM2ForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter
from loong_llm.hf.mapping import Rule

L = "decoder.layers.{i}."
H = "model.layers.{i}."


class MiniMaxM2HFAdapter(DecoderHFAdapter):
    """MiniMax-M2 checkpoints: Llama-layout attention with ``q_norm`` / ``k_norm`` over the whole
    projection (``[num_heads * head_dim]``, a plain copy: each TP rank's slice is its heads'),
    and in every layer mixtral-named experts: ``block_sparse_moe.gate`` (router),
    ``block_sparse_moe.e_score_correction_bias`` and ``block_sparse_moe.experts.E.w1/w2/w3``
    (gate / down / up), each ``intermediate_size`` wide."""

    family = "minimax_m2"
    model_types = ("minimax_m2",)
    architecture = "MiniMaxM2ForCausalLM"
    aliases = {"num_experts": "num_local_experts"}

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("scoring_func", "sigmoid") != "sigmoid" or not hf.get("use_routing_bias", True):
            raise ConfigError("the 'minimax_m2' family routes with sigmoid scores and a routing "
                              "bias (config.json scoring_func / use_routing_bias differ).")
        if hf.get("qk_norm_type", "per_layer") != "per_layer":
            raise ConfigError(f"qk_norm_type={hf['qk_norm_type']!r} is not supported by the "
                              "'minimax_m2' family (only 'per_layer': one norm over the projection).")
        return {**super().config_from_hf(hf), "add_qkv_bias": False, "qk_layernorm": True,
                "num_experts": hf["num_local_experts"], "moe_router_topk": hf["num_experts_per_tok"],
                "moe_ffn_hidden_size": hf["intermediate_size"], "moe_layer_freq": 1,
                "moe_shared_expert_intermediate_size": 0}

    def config_to_hf(self, cfg) -> dict:
        return {**super().config_to_hf(cfg), "head_dim": cfg.head_dim(),
                "rotary_dim": cfg.rotary_dim(),
                "intermediate_size": cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size(),
                "num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.moe_router_topk}

    def mlp_rules(self, cfg) -> list[Rule]:
        m, h = L + "mlp.", H + "block_sparse_moe."
        ex, hx = m + "experts.local_experts.{e}.", h + "experts.{e}."
        return [
            Rule(m + "router.weight", (h + "gate.weight",)),
            Rule(m + "router.expert_bias", (h + "e_score_correction_bias",)),
            Rule(ex + "linear_fc1.weight", (hx + "w1.weight", hx + "w3.weight"), "gate_up"),
            Rule(ex + "linear_fc2.weight", (hx + "w2.weight",)),
        ]
