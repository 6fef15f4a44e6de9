"""The HF adapter shared by the dense decoder families (Llama, Qwen2, Qwen3)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.config import RopeScalingConfig
from loong_llm.hf.adapter import HFAdapter
from loong_llm.hf.mapping import Rule

logger = logging.getLogger(__name__)

L = "decoder.layers.{i}."
H = "model.layers.{i}."
MTP_KEY = "num_nextn_predict_layers"  # HF: MTP layers stored after the decoder's


def mtp_rules(cfg, rules: list[Rule]) -> list[Rule]:
    """``rules`` with the multi-token-prediction layers of ``cfg.mtp_num_layers`` added.

    MTP layer ``k`` is HF layer ``num_layers + k`` (DeepSeek-V3 / GLM-4.5 layout):
    ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` (megatron-core's ``final_layernorm``)
    and a decoder layer under the same names as the decoder's; its ``embed_tokens`` and
    ``shared_head.head`` are copies of the model's embedding and output head (written on
    export, not read: megatron-core shares them).
    """
    depth = getattr(cfg, "mtp_num_layers", None) or 0
    if not depth:
        return rules
    hf_layers = [f"model.layers.{cfg.num_layers + k}." for k in range(depth)]
    out = []
    for rule in rules:
        if rule.loong == "embedding.word_embeddings.weight":
            heads = () if cfg.untie_embeddings_and_output_weights else ("shared_head.head.weight",)
            also = tuple(h + n for h in hf_layers for n in ("embed_tokens.weight", *heads))
            rule = Rule(rule.loong, rule.hf, rule.kind, rule.export, rule.block, rule.also + also)
        elif rule.loong == "output_layer.weight" and rule.export:
            also = tuple(h + "shared_head.head.weight" for h in hf_layers)
            rule = Rule(rule.loong, rule.hf, rule.kind, rule.export, rule.block, rule.also + also)
        out.append(rule)
    for k, hf_layer in enumerate(hf_layers):
        m = f"mtp.layers.{k}."
        out += [Rule(m + "enorm.weight", (hf_layer + "enorm.weight",)),
                Rule(m + "hnorm.weight", (hf_layer + "hnorm.weight",)),
                Rule(m + "eh_proj.weight", (hf_layer + "eh_proj.weight",)),
                Rule(m + "final_layernorm.weight", (hf_layer + "shared_head.norm.weight",))]
        out += [Rule(r.loong.replace(L, m + "transformer_layer."),
                     tuple(h.replace(H, hf_layer) for h in r.hf), r.kind, r.export, r.block)
                for r in rules if r.loong.startswith(L)]
    return out


def mtp_layers_from_hf(cfg, hf: dict, hf_dir: str | Path) -> int | None:
    """``model.mtp_num_layers`` for an HF directory: its ``num_nextn_predict_layers`` when the
    checkpoint holds those layers' weights, else None (MTP off, as transformers runs it).

    Raises:
        ConfigError: ``model.mtp_num_layers`` asks for more MTP layers than the checkpoint has.
    """
    from loong_llm.hf.io import SafetensorsReader

    wanted = getattr(cfg, "mtp_num_layers", None)
    listed = int(hf.get(MTP_KEY) or 0)
    keys = set(SafetensorsReader(hf_dir).keys()) if (listed or wanted) else set()
    stored = 0
    while f"model.layers.{hf['num_hidden_layers'] + stored}.eh_proj.weight" in keys:
        stored += 1
    if wanted and wanted > stored:
        raise ConfigError(
            f"'model.mtp_num_layers' = {wanted} but {hf_dir} holds the weights of {stored} MTP "
            f"layer(s) ({MTP_KEY} = {listed} in its config.json); set model.mtp_num_layers="
            f"{stored or 'null'}.")
    if listed and stored < listed:
        logger.info("%s/config.json lists %s = %d but the checkpoint holds %d MTP layer(s): "
                    "multi-token prediction uses those", hf_dir, MTP_KEY, listed, stored)
    return (wanted or min(listed, stored)) or None


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
    ``mlp.{gate,up,down}_proj``, RMSNorms, ``model.norm``, ``lm_head``; multi-token prediction
    layers after the decoder's (:func:`mtp_rules`)."""

    def apply_hf_config(self, cfg, hf_dir: str | Path) -> None:
        wanted = getattr(cfg, "mtp_num_layers", None)
        super().apply_hf_config(cfg, hf_dir)
        if hasattr(cfg, "mtp_num_layers"):
            from loong_llm.hf.adapter import read_hf_config

            cfg.mtp_num_layers = wanted
            cfg.mtp_num_layers = mtp_layers_from_hf(cfg, read_hf_config(hf_dir), hf_dir)

    def full_hf_config(self, cfg, base: dict | None, dtype: str) -> dict:
        out = super().full_hf_config(cfg, base, dtype)
        if getattr(cfg, "mtp_num_layers", None):
            out[MTP_KEY] = cfg.mtp_num_layers
        return out

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
        return mtp_rules(cfg, rules)
