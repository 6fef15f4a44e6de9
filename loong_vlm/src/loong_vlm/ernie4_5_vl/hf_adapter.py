"""HF <-> loong for ERNIE-4.5-VL (``Ernie4_5_VLMoeForConditionalGeneration``, transformers'
``ernie4_5_vl_moe``): config and every tensor, in the names ``save_pretrained`` writes.

The stored layout is Baidu's (``model.layers.*``, ``model.vision_model.*``,
``model.resampler_model.*``, ``lm_head``), which ``save_pretrained`` writes. The decoder is
loong_llm's Llama-layout table (attention, dense first layers, norms, embedding / head) plus each
MoE layer's ``text_moe`` / ``vision_moe`` router, expert-score bias (the router's ``expert_bias``)
and experts, and ``shared_experts``, under the per-modality names
:mod:`~loong_vlm.ernie4_5_vl.checkpoint_names` maps to the stored ones. The vision tower's fused
``attn.qkv`` is regrouped per head.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter, rope_to_hf
from loong_llm.families.common.moe import moe_layer_pattern
from loong_llm.hf.adapter import read_hf_config
from loong_llm.hf.mapping import Rule, RuleSet, Shape
from loong_vlm.ernie4_5_vl.checkpoint_names import ErnieReader, ErnieWriter
from loong_vlm.hf_adapter import PartsRuleSet, VLMHFAdapter, text_config
from loong_vlm.qwen3_vl.rules import FUSED_QKV, FusedQKVRuleSet

L, H = "decoder.layers.{i}.mlp.", "model.layers.{i}.mlp."
VB, VL = "model.vision_model.blocks.{i}.", "encoder.blocks.layers.{i}."


class ErnieTextHFAdapter(DecoderHFAdapter):
    """ERNIE-4.5-VL's ``text_config`` and decoder tensors (``model.*`` names of the text model)."""

    family = "ernie4_5_vl_text"
    model_types = ("ernie4_5_vl_moe_text",)

    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        if hf.get("use_bias"):
            raise ConfigError("text_config.use_bias = true is not supported by ERNIE-4.5-VL's decoder.")
        rope = hf.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ConfigError(f"text_config.rope_parameters.rope_type = {rope['rope_type']!r}; ERNIE-4.5-VL "
                              "uses default (3D) RoPE.")
        text_width, vision_width = hf.get("moe_intermediate_size") or [1536, 512]
        layers = hf["num_hidden_layers"]
        kinds = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
        return {**super().config_from_hf(hf), "position_embedding_type": "mrope",
                "mrope_section": list(rope.get("mrope_section", [22, 22, 20])),
                "num_experts": hf.get("moe_num_experts", 64), "moe_router_topk": hf.get("moe_k", 6),
                "moe_ffn_hidden_size": text_width, "vision_moe_ffn_hidden_size": vision_width,
                "moe_shared_expert_intermediate_size": (hf.get("moe_num_shared_experts", 2) or 0) * text_width,
                "moe_layer_freq": [int(kind == "sparse") for kind in kinds],
                "moe_aux_loss_coeff": hf.get("router_aux_loss_coef", 1e-3)}

    def config_to_hf(self, cfg) -> dict[str, Any]:
        out = super().config_to_hf(cfg)
        width = cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size()
        shared = cfg.moe_shared_expert_intermediate_size or 0
        if shared % width:
            raise ConfigError(f"model.foundation.moe_shared_expert_intermediate_size = {shared} is not a multiple "
                              f"of moe_ffn_hidden_size = {width} (HF counts shared experts of that width).")
        out.pop("head_dim", None)
        return {**out, "rope_parameters": {**rope_to_hf(cfg), "mrope_section": list(cfg.mrope_section)},
                "moe_intermediate_size": [width, cfg.vision_moe_ffn_hidden_size or width],
                "moe_num_experts": cfg.num_experts, "moe_k": cfg.moe_router_topk,
                "moe_num_shared_experts": shared // width, "use_bias": False,
                "mlp_layer_types": ["sparse" if moe else "dense" for moe in moe_layer_pattern(cfg)],
                "router_aux_loss_coef": cfg.moe_aux_loss_coeff}

    def mlp_rules(self, cfg) -> list[Rule]:
        rules = list(super().mlp_rules(cfg))  # the dense layers
        for part in ("text_moe", "vision_moe"):
            lm, hm = f"{L}{part}.", f"{H}{part}."
            ex, hx = lm + "experts.local_experts.{e}.", hm + "experts.{e}."
            rules += [Rule(lm + "router.weight", (hm + "gate.weight",)),
                      Rule(lm + "router.expert_bias", (hm + "gate.e_score_correction_bias",)),
                      Rule(ex + "linear_fc1.weight", (hx + "gate_proj.weight", hx + "up_proj.weight"), "gate_up"),
                      Rule(ex + "linear_fc2.weight", (hx + "down_proj.weight",))]
        s, hs = L + "shared_experts.", H + "shared_experts."
        rules += [Rule(s + "linear_fc1.weight", (hs + "gate_proj.weight", hs + "up_proj.weight"), "gate_up"),
                  Rule(s + "linear_fc2.weight", (hs + "down_proj.weight",))]
        return rules


class Ernie45VLHFAdapter(VLMHFAdapter):
    """ERNIE-4.5-VL checkpoints: ``model.vision_model.*``, ``model.resampler_model.*``,
    ``model.layers.*`` (modality-isolated MoE layers), ``model.norm``, ``lm_head``."""

    family = "ernie4_5_vl"
    model_types = ("ernie4_5_vl_moe",)
    architecture = "Ernie4_5_VLMoeForConditionalGeneration"
    text = ErnieTextHFAdapter()
    _VISION_TOKENS = ("image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id")

    # -- config ----------------------------------------------------------------------------
    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """``{"encoder", "projector", "foundation": {...}, "image_token_id", ...}``."""
        text, vision = text_config(hf), dict(hf.get("vision_config") or {})
        if not hf.get("text_config") or not vision:
            raise ConfigError("an ERNIE-4.5-VL config.json needs text_config and vision_config.")
        rope = vision.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ConfigError(f"vision_config.rope_parameters.rope_type = {rope['rope_type']!r}; ERNIE's ViT is axial.")
        if vision.get("temporal_merge_size", 2) != 2:
            raise ConfigError(f"vision_config.temporal_merge_size = {vision['temporal_merge_size']}: the resampler "
                              "pairs frames (2), as transformers' does.")
        merge = vision.get("spatial_merge_size", 2)
        encoder = dict(num_layers=vision.get("depth", 32), hidden_size=vision.get("hidden_size", 1280),
                       num_attention_heads=vision.get("num_heads", 16),
                       ffn_hidden_size=vision.get("intermediate_size", 4 * 1280),
                       hidden_act=vision.get("hidden_act", "quick_gelu"), patch_size=vision.get("patch_size", 14),
                       num_channels=vision.get("in_channels", 3), spatial_merge_size=merge,
                       rope_theta=float(rope.get("rope_theta", 10000.0)),
                       norm_epsilon=vision.get("rms_norm_eps", 1e-6))
        projector = dict(spatial_merge_size=merge, layer_norm_epsilon=vision.get("rms_norm_eps", 1e-6),
                         norm_epsilon=text.get("rms_norm_eps", 1e-5))
        top = {key: hf[key] for key in ("image_token_id", "video_token_id") if key in hf}
        top["vision_start_token_ids"] = [hf[key] for key in self._VISION_TOKENS if hf.get(key) is not None]
        return {"encoder": encoder, "projector": projector, "foundation": self.text.config_from_hf(text), **top}

    def config_to_hf(self, cfg) -> dict[str, Any]:
        e, p, f = cfg.encoder, cfg.projector, cfg.foundation
        text = self.text.config_to_hf(f)
        tie = text.pop("tie_word_embeddings")  # top-level in ERNIE-4.5-VL (the text config keeps its own)
        vision = dict(depth=e.num_layers, hidden_size=e.hidden_size, num_heads=e.num_attention_heads,
                      intermediate_size=e.ffn_hidden_size, hidden_act=e.hidden_act, patch_size=e.patch_size,
                      in_channels=e.num_channels, spatial_merge_size=e.spatial_merge_size,
                      temporal_merge_size=p.temporal_merge_size, rms_norm_eps=e.norm_epsilon,
                      rope_parameters={"rope_type": "axial", "rope_theta": e.rope_theta})
        if p.norm_epsilon != f.norm_epsilon or p.layer_norm_epsilon != e.norm_epsilon:
            raise ConfigError("model.projector.norm_epsilon / layer_norm_epsilon must equal the foundation's / "
                              "encoder's norm_epsilon (HF keeps one of each).")
        out = {"text_config": {**text, "model_type": "ernie4_5_vl_moe_text"},
               "vision_config": {**vision, "model_type": "ernie4_5_vl_moe_vision"},
               "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
               "tie_word_embeddings": tie}
        if len(cfg.vision_start_token_ids) == len(self._VISION_TOKENS):
            out.update(zip(self._VISION_TOKENS, cfg.vision_start_token_ids))
        return out

    # -- tensors ---------------------------------------------------------------------------
    def reader(self, hf_dir: str | Path) -> ErnieReader:
        """The checkpoint's tensors, the MoE ones under their per-modality names."""
        from loong_llm.hf.io import SafetensorsReader

        experts = read_hf_config(hf_dir)["text_config"].get("moe_num_experts", 64)
        return ErnieReader(SafetensorsReader(hf_dir), experts)

    def export_stacker(self, cfg) -> ErnieWriter:
        return ErnieWriter(cfg.foundation.num_experts)

    def rules(self, cfg) -> list[Rule]:
        return self.rule_set(cfg).rules

    def rule_set(self, cfg) -> PartsRuleSet:
        e, f = cfg.encoder, cfg.foundation
        text = self.text.rule_set(f)
        text_rules = [dataclasses.replace(rule, loong="language_model." + rule.loong) for rule in text.rules]
        shape = Shape(num_heads=e.num_attention_heads, num_groups=e.num_attention_heads,
                      head_dim=e.hidden_size // e.num_attention_heads, vocab_size=0)
        return PartsRuleSet([RuleSet(text_rules, text.shape), FusedQKVRuleSet(vision_rules(), shape)])


def vision_rules() -> list[Rule]:
    """The vision tower's and the resampler's tensors."""
    r = "model.resampler_model."
    pairs = [("encoder.patch_embed.weight", "model.vision_model.patch_embed.proj.weight"),
             ("projector.norm.weight", r + "after_norm.weight")]
    for param in ("weight", "bias"):
        pairs += [(f"encoder.blocks.final_layernorm.{param}", f"model.vision_model.ln.{param}"),
                  (f"{VL}input_layernorm.{param}", f"{VB}norm1.{param}"),
                  (f"{VL}self_attention.linear_proj.{param}", f"{VB}attn.proj.{param}"),
                  (f"{VL}pre_mlp_layernorm.{param}", f"{VB}norm2.{param}"),
                  (f"{VL}mlp.linear_fc1.{param}", f"{VB}mlp.fc1.{param}"),
                  (f"{VL}mlp.linear_fc2.{param}", f"{VB}mlp.fc2.{param}"),
                  (f"projector.linear.{param}", f"{r}mlp.{param}")]
        for ours, theirs in (("spatial", "spatial_linear"), ("temporal", "temporal_linear")):
            pairs += [(f"projector.{ours}.linear_fc1.{param}", f"{r}{theirs}.0.{param}"),
                      (f"projector.{ours}.linear_fc2.{param}", f"{r}{theirs}.2.{param}"),
                      (f"projector.{ours}.norm.{param}", f"{r}{theirs}.3.{param}")]
    rules = [Rule(loong, (hf,)) for loong, hf in pairs]
    rules += [Rule(f"{VL}self_attention.linear_qkv.{param}", (f"{VB}attn.qkv.{param}",), FUSED_QKV)
              for param in ("weight", "bias")]
    return rules
