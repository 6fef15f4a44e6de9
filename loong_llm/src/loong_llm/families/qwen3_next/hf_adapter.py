"""HF <-> loong mapping of the Qwen3-Next family (``Qwen3NextForCausalLM``) and the hybrid-stack
pieces Qwen3.5 shares with it."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter, H, L
from loong_llm.families.common.moe import expert_rules, moe_layer_pattern
from loong_llm.hf.mapping import Rule

A, G, D = H + "self_attn.", H + "linear_attn.", L + "self_attention."
_LINEAR = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
           "linear_num_key_heads", "linear_num_value_heads")


def hybrid_from_hf(hf: dict, family: str) -> dict[str, Any]:
    """The hybrid-stack fields of a Qwen3-Next / Qwen3.5 text config.json."""
    if hf.get("attention_bias"):
        raise ConfigError(f"attention_bias=true is not supported by the '{family}' family.")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={hf['hidden_act']!r} is not supported by the '{family}' "
                          "family (SiLU only).")
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % hf.get("full_attention_interval", 4) == 0 else "linear_attention"
        for i in range(hf["num_hidden_layers"])]
    return {"add_qkv_bias": False, "qk_layernorm": True,
            "linear_attention_freq": [1 if t == "linear_attention" else 0 for t in types],
            **{key: hf[key] for key in _LINEAR}}


def hybrid_to_hf(cfg) -> dict[str, Any]:
    """config.json fields of the hybrid stack."""
    return {"attention_bias": False, "head_dim": cfg.head_dim(),
            "layer_types": ["linear_attention" if x else "full_attention" for x in cfg.linear_layers()],
            **{key: getattr(cfg, key) for key in _LINEAR}}


def gated_attention_rules() -> list[Rule]:
    """Full attention: ``q_proj`` holds each head's query and gate (``gated_qkv``), q/k norms."""
    return [
        Rule(D + "linear_qkv.weight", (A + "q_proj.weight", A + "k_proj.weight", A + "v_proj.weight"),
             "gated_qkv"),
        Rule(D + "linear_proj.weight", (A + "o_proj.weight",)),
        Rule(D + "q_layernorm.weight", (A + "q_norm.weight",)),
        Rule(D + "k_layernorm.weight", (A + "k_norm.weight",)),
    ]


def gdn_rules(cfg, split_projections: bool) -> list[Rule]:
    """Gated DeltaNet tensors. Qwen3-Next stores ``in_proj_qkvz`` / ``in_proj_ba`` already grouped
    by key head (copied); Qwen3.5 (``split_projections``) stores ``in_proj_qkv`` (all queries,
    all keys, all values), ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, regrouped into loong's
    two projections. The convolution's channels are regrouped the same way (kind ``grouped``)."""
    r = cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, rv = cfg.linear_key_head_dim, r * cfg.linear_value_head_dim
    if split_projections:
        projections = [
            Rule(D + "in_proj_qkvz.weight", (G + "in_proj_qkv.weight", G + "in_proj_z.weight"),
                 "grouped", sections=((dk, dk, rv), (rv,))),
            Rule(D + "in_proj_ba.weight", (G + "in_proj_b.weight", G + "in_proj_a.weight"),
                 "grouped", sections=((r,), (r,)))]
    else:
        projections = [Rule(D + "in_proj_qkvz.weight", (G + "in_proj_qkvz.weight",)),
                       Rule(D + "in_proj_ba.weight", (G + "in_proj_ba.weight",))]
    return [*projections,
            Rule(D + "conv_weight", (G + "conv1d.weight",), "grouped", sections=(dk, dk, rv)),
            Rule(D + "dt_bias", (G + "dt_bias",)),
            Rule(D + "A_log", (G + "A_log",)),
            Rule(D + "norm.weight", (G + "norm.weight",)),
            Rule(D + "out_proj.weight", (G + "out_proj.weight",))]


def gated_moe_from_hf(hf: dict) -> dict[str, Any]:
    """MoE fields of Qwen3-Next / Qwen3.5-MoE: softmax top-k router, gated shared expert."""
    layers = hf["num_hidden_layers"]
    step = hf.get("decoder_sparse_step", 1) or 1
    dense = set(hf.get("mlp_only_layers") or [])
    moe = [0 if (i in dense or (i + 1) % step) else 1 for i in range(layers)]
    return {"num_experts": hf["num_experts"], "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": hf.get("shared_expert_intermediate_size") or 0,
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", True),
            "moe_router_score_function": "softmax",
            "moe_aux_loss_coeff": hf.get("router_aux_loss_coef", 1e-3),
            "moe_layer_freq": 1 if all(moe) else moe}


def gated_moe_to_hf(cfg) -> dict[str, Any]:
    pattern = moe_layer_pattern(cfg)
    return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.moe_router_topk,
            "moe_intermediate_size": cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size(),
            "shared_expert_intermediate_size": cfg.moe_shared_expert_intermediate_size,
            "norm_topk_prob": not cfg.moe_router_pre_softmax,
            "router_aux_loss_coef": cfg.moe_aux_loss_coeff, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, moe in enumerate(pattern) if not moe]}


def gated_moe_rules() -> list[Rule]:
    """Router, routed experts (per-expert layout), ``shared_expert`` and ``shared_expert_gate``."""
    m, hm = L + "mlp.", H + "mlp."
    return [*expert_rules(),
            Rule(m + "shared_experts.linear_fc1.weight",
                 (hm + "shared_expert.gate_proj.weight", hm + "shared_expert.up_proj.weight"), "gate_up"),
            Rule(m + "shared_experts.linear_fc2.weight", (hm + "shared_expert.down_proj.weight",)),
            Rule(m + "shared_experts.gate_weight", (hm + "shared_expert_gate.weight",))]


class Qwen3NextHFAdapter(DecoderHFAdapter):
    """Qwen3-Next checkpoints: per layer ``linear_attn.*`` (Gated DeltaNet: ``in_proj_qkvz``,
    ``in_proj_ba``, ``conv1d``, ``dt_bias``, ``A_log``, ``norm``, ``out_proj``) or ``self_attn.*``
    (``q_proj`` with each head's query and gate, ``k_proj``, ``v_proj``, ``q_norm`` / ``k_norm``,
    ``o_proj``), then ``mlp.gate``, ``mlp.experts.E``, ``mlp.shared_expert`` and
    ``mlp.shared_expert_gate``. Norm weights are stored zero-centred, as loong keeps them."""

    family = "qwen3_next"
    model_types = ("qwen3_next",)
    architecture = "Qwen3NextForCausalLM"
    split_projections = False  # Qwen3.5: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a
    moe = True
    # config.json keys this family's configs do not have (Qwen3.5-MoE: every layer MoE, top-k
    # weights always renormalised); not written on export
    absent_keys: tuple[str, ...] = ()

    def config_from_hf(self, hf: dict) -> dict:
        if "intermediate_size" in self.absent_keys:  # no dense layers: their width is unused
            hf = {**hf, "intermediate_size": hf.get("intermediate_size") or hf["moe_intermediate_size"]}
        out = {**super().config_from_hf(hf), **hybrid_from_hf(hf, self.family)}
        return {**out, **gated_moe_from_hf(hf)} if self.moe else out

    def config_to_hf(self, cfg) -> dict:
        out = {**super().config_to_hf(cfg), **hybrid_to_hf(cfg)}
        if self.moe:
            out.update(gated_moe_to_hf(cfg))
        return {k: v for k, v in out.items() if k not in self.absent_keys}

    def attention_rules(self, cfg) -> list[Rule]:
        return [*gated_attention_rules(), *gdn_rules(cfg, self.split_projections)]

    def mlp_rules(self, cfg) -> list[Rule]:
        return [*super().mlp_rules(cfg), *(gated_moe_rules() if self.moe else ())]
