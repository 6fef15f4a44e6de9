"""HF <-> loong mapping of the Qwen3-Next family (``Qwen3NextForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter, H, L
from loong_llm.families.common.moe import expert_rules, moe_layer_pattern
from loong_llm.hf.mapping import Rule


class Qwen3NextHFAdapter(DecoderHFAdapter):
    """Qwen3-Next checkpoints: per layer ``linear_attn.*`` (Gated DeltaNet: ``in_proj_qkvz``,
    ``in_proj_ba``, ``conv1d``, ``dt_bias``, ``A_log``, ``norm``, ``out_proj``) or ``self_attn.*``
    (``q_proj`` with each head's query and gate, ``k_proj``, ``v_proj``, ``q_norm`` / ``k_norm``,
    ``o_proj``), then ``mlp.gate``, ``mlp.experts.E``, ``mlp.shared_expert`` and
    ``mlp.shared_expert_gate``. Norm weights are stored zero-centred, as loong keeps them."""

    family = "qwen3_next"
    model_types = ("qwen3_next",)
    architecture = "Qwen3NextForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported by the 'qwen3_next' family.")
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act={hf['hidden_act']!r} is not supported by the 'qwen3_next' "
                              "family (SiLU only).")
        layers = hf["num_hidden_layers"]
        types = hf.get("layer_types") or [
            "full_attention" if (i + 1) % hf.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(layers)]
        step = hf.get("decoder_sparse_step", 1) or 1
        dense = set(hf.get("mlp_only_layers") or [])
        moe = [0 if (i in dense or (i + 1) % step) else 1 for i in range(layers)]
        return {
            **super().config_from_hf(hf), "add_qkv_bias": False, "qk_layernorm": True,
            "linear_attention_freq": [1 if t == "linear_attention" else 0 for t in types],
            "linear_conv_kernel_dim": hf["linear_conv_kernel_dim"],
            "linear_key_head_dim": hf["linear_key_head_dim"],
            "linear_value_head_dim": hf["linear_value_head_dim"],
            "linear_num_key_heads": hf["linear_num_key_heads"],
            "linear_num_value_heads": hf["linear_num_value_heads"],
            "num_experts": hf["num_experts"], "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": hf.get("shared_expert_intermediate_size") or 0,
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", True),
            "moe_router_score_function": "softmax",
            "moe_aux_loss_coeff": hf.get("router_aux_loss_coef", 1e-3),
            "moe_layer_freq": 1 if all(moe) else moe,
        }

    def config_to_hf(self, cfg) -> dict:
        pattern = moe_layer_pattern(cfg)
        return {
            **super().config_to_hf(cfg), "attention_bias": False, "head_dim": cfg.head_dim(),
            "layer_types": ["linear_attention" if x else "full_attention" for x in cfg.linear_layers()],
            "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
            "linear_key_head_dim": cfg.linear_key_head_dim,
            "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_num_key_heads": cfg.linear_num_key_heads,
            "linear_num_value_heads": cfg.linear_num_value_heads,
            "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.moe_router_topk,
            "moe_intermediate_size": cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size(),
            "shared_expert_intermediate_size": cfg.moe_shared_expert_intermediate_size,
            "norm_topk_prob": not cfg.moe_router_pre_softmax,
            "router_aux_loss_coef": cfg.moe_aux_loss_coeff, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, moe in enumerate(pattern) if not moe],
        }

    def attention_rules(self, cfg) -> list[Rule]:
        """Gated full attention (``gated_qkv``) and the Gated DeltaNet layers' tensors."""
        a, g, d = H + "self_attn.", H + "linear_attn.", L + "self_attention."
        r = cfg.linear_num_value_heads // cfg.linear_num_key_heads
        widths = (cfg.linear_key_head_dim, cfg.linear_key_head_dim, r * cfg.linear_value_head_dim)
        return [
            Rule(d + "linear_qkv.weight", (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                 "gated_qkv"),
            Rule(d + "linear_proj.weight", (a + "o_proj.weight",)),
            Rule(d + "q_layernorm.weight", (a + "q_norm.weight",)),
            Rule(d + "k_layernorm.weight", (a + "k_norm.weight",)),
            Rule(d + "in_proj_qkvz.weight", (g + "in_proj_qkvz.weight",)),
            Rule(d + "in_proj_ba.weight", (g + "in_proj_ba.weight",)),
            Rule(d + "conv_weight", (g + "conv1d.weight",), "grouped", sections=widths),
            Rule(d + "dt_bias", (g + "dt_bias",)),
            Rule(d + "A_log", (g + "A_log",)),
            Rule(d + "norm.weight", (g + "norm.weight",)),
            Rule(d + "out_proj.weight", (g + "out_proj.weight",)),
        ]

    def mlp_rules(self, cfg) -> list[Rule]:
        m, hm = L + "mlp.", H + "mlp."
        return [*super().mlp_rules(cfg), *expert_rules(),
                Rule(m + "shared_experts.linear_fc1.weight",
                     (hm + "shared_expert.gate_proj.weight", hm + "shared_expert.up_proj.weight"), "gate_up"),
                Rule(m + "shared_experts.linear_fc2.weight", (hm + "shared_expert.down_proj.weight",)),
                Rule(m + "shared_experts.gate_weight", (hm + "shared_expert_gate.weight",))]
