"""HF <-> loong mapping of the DeepSeek-V3 family (``DeepseekV3ForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter, rope_from_hf, rope_to_hf
from loong_llm.families.common.moe import deepseek_moe_from_hf, deepseek_moe_rules, deepseek_moe_to_hf
from loong_llm.hf.mapping import Rule

L = "decoder.layers.{i}."
H = "model.layers.{i}."


class DeepSeekV3HFAdapter(DecoderHFAdapter):
    """DeepSeek-V3 checkpoints: MLA (``q_a_proj``/``q_b_proj``/``kv_a_proj_with_mqa``/``kv_b_proj``
    and their latent norms), dense layers before ``first_k_dense_replace``, then ``mlp.gate``
    (+ ``e_score_correction_bias``), routed ``mlp.experts.E`` and ``mlp.shared_experts``."""

    family = "deepseek_v3"
    model_types = ("deepseek_v3",)
    architecture = "DeepseekV3ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        base, scaling = rope_from_hf(hf)
        if scaling.rope_type not in ("default", "yarn"):
            raise ConfigError(f"rope_parameters.rope_type={scaling.rope_type!r} is not supported by "
                              f"the '{self.family}' family (MLA); it reads default and yarn.")
        if not hf.get("norm_topk_prob", True) or hf.get("attention_bias"):
            raise ConfigError("norm_topk_prob=false / attention_bias=true are not supported by "
                              "the 'deepseek_v3' family.")
        if not hf.get("q_lora_rank"):
            raise ConfigError("DeepSeek checkpoints without q_lora_rank (V2-Lite) are not supported.")
        return dict(
            num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
            num_attention_heads=hf["num_attention_heads"], ffn_hidden_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"], max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rotary_base=base, rope_scaling=scaling, norm_epsilon=hf.get("rms_norm_eps", 1e-6),
            untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
            q_lora_rank=hf["q_lora_rank"], kv_lora_rank=hf["kv_lora_rank"],
            qk_head_dim=hf["qk_nope_head_dim"], qk_pos_emb_head_dim=hf["qk_rope_head_dim"],
            v_head_dim=hf["v_head_dim"], rope_interleave=bool(hf.get("rope_interleave", True)),
            **deepseek_moe_from_hf(hf),
        )

    def config_to_hf(self, cfg) -> dict:
        return dict(
            num_hidden_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_attention_heads,
            intermediate_size=cfg.resolved_ffn_hidden_size(),
            vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=rope_to_hf(cfg),
            rms_norm_eps=cfg.norm_epsilon,
            tie_word_embeddings=not cfg.untie_embeddings_and_output_weights,
            q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_head_dim, qk_rope_head_dim=cfg.qk_pos_emb_head_dim,
            v_head_dim=cfg.v_head_dim, rope_interleave=cfg.rope_interleave,
            **deepseek_moe_to_hf(cfg), hidden_act="silu", attention_bias=False,
        )

    def attention_rules(self, cfg) -> list[Rule]:
        a, s = H + "self_attn.", L + "self_attention."
        rope = "copy" if cfg.rope_interleave else "rope_rows"  # MLA wants interleaved pairs
        return [
            Rule(s + "linear_q_down_proj.weight", (a + "q_a_proj.weight",)),
            Rule(s + "q_layernorm.weight", (a + "q_a_layernorm.weight",)),
            Rule(s + "linear_q_up_proj.weight", (a + "q_b_proj.weight",), rope,
                 block=cfg.qk_head_dim + cfg.qk_pos_emb_head_dim),
            Rule(s + "linear_kv_down_proj.weight", (a + "kv_a_proj_with_mqa.weight",), rope,
                 block=cfg.kv_lora_rank + cfg.qk_pos_emb_head_dim),
            Rule(s + "kv_layernorm.weight", (a + "kv_a_layernorm.weight",)),
            Rule(s + "linear_kv_up_proj.weight", (a + "kv_b_proj.weight",)),
            Rule(s + "linear_proj.weight", (a + "o_proj.weight",)),
        ]

    def mlp_rules(self, cfg) -> list[Rule]:
        return [*super().mlp_rules(cfg), *deepseek_moe_rules()]  # dense first layers, then MoE
