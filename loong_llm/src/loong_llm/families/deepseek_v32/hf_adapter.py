"""HF <-> loong mapping of the DeepSeek-V3.2 family (``DeepseekV32ForCausalLM``)."""

from __future__ import annotations

from loong_llm.families.common.moe import moe_layer_pattern
from loong_llm.families.deepseek_v3.hf_adapter import DeepSeekV3HFAdapter, H, L
from loong_llm.hf.mapping import Rule


class DeepSeekV32HFAdapter(DeepSeekV3HFAdapter):
    """DeepSeek-V3 checkpoints plus ``self_attn.indexer.{wq_b, wk, k_norm, weights_proj}``.
    transformers' V3.2 always lays MLA's RoPE out in interleaved pairs."""

    family = "deepseek_v32"
    model_types = ("deepseek_v32",)
    architecture = "DeepseekV32ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        return {**super().config_from_hf({**hf, "rope_interleave": True}),
                "dsa_indexer_n_heads": hf["index_n_heads"], "dsa_indexer_head_dim": hf["index_head_dim"],
                "dsa_indexer_topk": hf["index_topk"]}

    def config_to_hf(self, cfg) -> dict:
        out = super().config_to_hf(cfg)
        out.pop("rope_interleave", None)
        return {**out, "index_n_heads": cfg.dsa_indexer_n_heads,
                "index_head_dim": cfg.dsa_indexer_head_dim, "index_topk": cfg.dsa_indexer_topk,
                "head_dim": cfg.qk_pos_emb_head_dim, "qk_head_dim": cfg.qk_head_dim + cfg.qk_pos_emb_head_dim,
                "mlp_layer_types": ["sparse" if moe else "dense" for moe in moe_layer_pattern(cfg)],
                "layer_types": ["indexed_attention"] * cfg.num_layers}

    def attention_rules(self, cfg) -> list[Rule]:
        i, s = H + "self_attn.indexer.", L + "self_attention.core_attention.indexer."
        return [*super().attention_rules(cfg),
                Rule(s + "linear_wq_b.weight", (i + "wq_b.weight",)),
                Rule(s + "linear_wk.weight", (i + "wk.weight",)),
                Rule(s + "k_norm.weight", (i + "k_norm.weight",)),
                Rule(s + "k_norm.bias", (i + "k_norm.bias",)),
                Rule(s + "linear_weights_proj.weight", (i + "weights_proj.weight",))]
