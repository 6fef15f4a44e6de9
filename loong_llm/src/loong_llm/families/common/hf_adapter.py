"""The HF adapter shared by the dense decoder families (Llama, Qwen2, Qwen3)."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.config import RopeScalingConfig
from loong_llm.hf.adapter import HFAdapter
from loong_llm.hf.mapping import Rule

L = "decoder.layers.{i}."
H = "model.layers.{i}."


def rope_from_hf(hf: dict) -> tuple[float, RopeScalingConfig]:
    """``(rotary_base, rope_scaling)`` from ``rope_parameters`` (transformers 5) or the older
    ``rope_theta`` / ``rope_scaling`` keys."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    base = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "default":
        return base, RopeScalingConfig()
    if rope_type == "yarn":
        return base, yarn_from_hf(hf, params)
    if rope_type != "llama3":
        raise ConfigError(f"RoPE type {rope_type!r} in config.json is not supported (supported: "
                          f"default, llama3, yarn).")
    return base, RopeScalingConfig(
        rope_type="llama3", factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]))


YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def yarn_from_hf(hf: dict, params: dict) -> RopeScalingConfig:
    """The ``yarn`` scaling of ``rope_parameters``; optional keys that are absent stay None (so
    that they stay absent on export)."""
    old_len = params.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
    if old_len is None:
        raise ConfigError("rope_parameters.rope_type='yarn' in config.json needs "
                          "'original_max_position_embeddings'.")
    factor = params.get("factor")
    if factor is None:
        raise ConfigError("rope_parameters.rope_type='yarn' in config.json needs 'factor'.")
    return RopeScalingConfig(rope_type="yarn", factor=float(factor),
                             original_max_position_embeddings=int(old_len),
                             **{k: params[k] for k in YARN_OPTIONAL if params.get(k) is not None})


def rotary_percent_from_hf(hf: dict) -> float:
    """Fraction of a head that RoPE rotates: ``partial_rotary_factor`` (in ``rope_parameters``
    with transformers 5, at the top level before), else MiniMax's ``rotary_dim / head_dim``."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if factor is None and hf.get("rotary_dim"):
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        factor = hf["rotary_dim"] / head_dim
    return float(factor if factor is not None else 1.0)


def rope_to_hf(cfg) -> dict:
    """``rope_parameters`` of transformers 5."""
    out: dict[str, Any] = {"rope_type": cfg.rope_scaling.rope_type, "rope_theta": cfg.rotary_base}
    if cfg.rotary_percent != 1.0:
        out["partial_rotary_factor"] = cfg.rotary_percent
    if cfg.rope_scaling.rope_type == "llama3":
        s = cfg.rope_scaling
        out.update(factor=s.factor, low_freq_factor=s.low_freq_factor,
                   high_freq_factor=s.high_freq_factor,
                   original_max_position_embeddings=s.original_max_position_embeddings)
    if cfg.rope_scaling.rope_type == "yarn":
        s = cfg.rope_scaling
        out.update(factor=s.factor, original_max_position_embeddings=s.original_max_position_embeddings)
        out.update({k: getattr(s, k) for k in YARN_OPTIONAL if getattr(s, k) is not None})
    return out


class DecoderHFAdapter(HFAdapter):
    """Llama-layout checkpoints: ``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
    ``mlp.{gate,up,down}_proj``, RMSNorms, ``model.norm``, ``lm_head``."""

    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        if hf.get("mlp_bias"):
            raise ConfigError(f"mlp_bias=true is not supported by the '{self.family}' family.")
        heads = hf["num_attention_heads"]
        base, scaling = rope_from_hf(hf)
        return dict(
            num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
            num_attention_heads=heads, num_query_groups=hf.get("num_key_value_heads") or heads,
            kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads,
            ffn_hidden_size=hf["intermediate_size"], vocab_size=hf["vocab_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rotary_base=base, rope_scaling=scaling, rotary_percent=rotary_percent_from_hf(hf),
            norm_epsilon=hf.get("rms_norm_eps", 1e-6),
            untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
        )

    def config_to_hf(self, cfg) -> dict[str, Any]:
        out = dict(
            num_hidden_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_query_groups or cfg.num_attention_heads,
            intermediate_size=cfg.resolved_ffn_hidden_size(),
            vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=rope_to_hf(cfg), rms_norm_eps=cfg.norm_epsilon,
            tie_word_embeddings=not cfg.untie_embeddings_and_output_weights,
            hidden_act="silu",
        )
        if cfg.head_dim() != cfg.hidden_size // cfg.num_attention_heads:
            out["head_dim"] = cfg.head_dim()  # only when it is not implied (Qwen3)
        return out

    def attention_rules(self, cfg) -> list[Rule]:
        """``linear_qkv`` (+ bias, + q/k norms) and ``linear_proj``."""
        a = H + "self_attn."
        rules = [Rule(L + "self_attention.linear_qkv.weight",
                      (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), "qkv"),
                 Rule(L + "self_attention.linear_proj.weight", (a + "o_proj.weight",))]
        if cfg.add_qkv_bias:
            rules.append(Rule(L + "self_attention.linear_qkv.bias",
                              (a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"), "qkv"))
        if cfg.qk_layernorm:
            rules += [Rule(L + "self_attention.q_layernorm.weight", (a + "q_norm.weight",)),
                      Rule(L + "self_attention.k_layernorm.weight", (a + "k_norm.weight",))]
        return rules

    def mlp_rules(self, cfg) -> list[Rule]:
        """Dense SwiGLU MLP: ``linear_fc1`` = [gate; up], ``linear_fc2`` = down."""
        return [Rule(L + "mlp.linear_fc1.weight", (H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"),
                     "gate_up"),
                Rule(L + "mlp.linear_fc2.weight", (H + "mlp.down_proj.weight",))]

    def rules(self, cfg) -> list[Rule]:
        rules = [
            Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),
            Rule(L + "input_layernorm.weight", (H + "input_layernorm.weight",)),
            Rule(L + "pre_mlp_layernorm.weight", (H + "post_attention_layernorm.weight",)),
            Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
            *self.attention_rules(cfg),
            *self.mlp_rules(cfg),
        ]
        if cfg.untie_embeddings_and_output_weights:
            rules.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
        else:  # the last pipeline stage's copy of the tied embedding
            rules.append(Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab",
                              export=False))
        return rules
