"""HF <-> loong mapping of the DeepSeek-V2 family (``DeepseekV2ForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.deepseek_v3.hf_adapter import DeepSeekV3HFAdapter
from loong_llm.hf.mapping import Rule

L = "decoder.layers.{i}."
H = "model.layers.{i}."


class DeepSeekV2HFAdapter(DeepSeekV3HFAdapter):
    """DeepSeek-V2 checkpoints: deepseek_v3's names, ``self_attn.q_proj`` instead of
    ``q_a_proj``/``q_a_layernorm``/``q_b_proj`` without ``q_lora_rank`` (V2-Lite), no
    ``gate.e_score_correction_bias``. RoPE dims are interleaved pairs (transformers' V2 rotates
    complex pairs), megatron-core MLA's layout."""

    family = "deepseek_v2"
    model_types = ("deepseek_v2",)
    architecture = "DeepseekV2ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        method = hf.get("topk_method", "greedy")
        groups, group_topk = hf.get("n_group"), hf.get("topk_group")
        if method not in ("greedy", "group_limited_greedy"):
            raise ConfigError(f"topk_method={method!r} in config.json is not supported by the "
                              "'deepseek_v2' family (it reads greedy, group_limited_greedy).")
        if method == "group_limited_greedy" and (groups or 1) > 1 and (
                not group_topk or hf["num_experts_per_tok"] // group_topk != 1):
            # transformers ranks groups by their best expert; megatron-core by the sum of their
            # top (topk / topk_group) experts: the same only when that is one expert.
            raise ConfigError(
                f"topk_method='group_limited_greedy' with num_experts_per_tok="
                f"{hf['num_experts_per_tok']} and topk_group={group_topk} is not supported by the "
                "'deepseek_v2' family: megatron-core ranks expert groups by the sum of their top "
                "num_experts_per_tok / topk_group scores, transformers by the best one; they agree "
                "only when num_experts_per_tok == topk_group.")
        # deepseek_v3's translation, without its q_lora_rank / norm_topk_prob refusals (V2's
        # router never renormalises; transformers ignores norm_topk_prob for V2)
        out = super().config_from_hf({**hf, "q_lora_rank": hf.get("q_lora_rank") or 1,
                                      "norm_topk_prob": True, "rope_interleave": True})
        out.update(q_lora_rank=hf.get("q_lora_rank") or None, rope_interleave=True,
                   moe_router_num_groups=groups, moe_router_group_topk=group_topk)
        return out

    def config_to_hf(self, cfg) -> dict:
        out = super().config_to_hf(cfg)
        for key in ("rope_interleave", "norm_topk_prob"):  # not V2 keys (the source's stays)
            out.pop(key)
        groups = cfg.moe_router_num_groups
        out.update(n_group=groups, topk_group=cfg.moe_router_group_topk,
                   topk_method="group_limited_greedy" if groups and groups > 1 else "greedy")
        return out

    def attention_rules(self, cfg) -> list[Rule]:
        rules = super().attention_rules(cfg)
        if cfg.q_lora_rank:
            return rules
        a, s = H + "self_attn.", L + "self_attention."
        q_names = {s + "linear_q_down_proj.weight", s + "q_layernorm.weight", s + "linear_q_up_proj.weight"}
        return [Rule(s + "linear_q_proj.weight", (a + "q_proj.weight",), "copy"),
                *(r for r in rules if r.loong not in q_names)]

    def mlp_rules(self, cfg) -> list[Rule]:
        """deepseek_v3's dense, expert and shared-expert rules, without the expert bias."""
        return [r for r in super().mlp_rules(cfg) if not r.loong.endswith("router.expert_bias")]
