"""HF <-> loong for Kimi-K2.5 (``Kimi_K25ForConditionalGeneration``, transformers' ``kimi_k25``):
config and every tensor. The decoder is loong_llm's ``deepseek_v3`` table under the composed
model's prefixes; the vision tower keeps MoonViT's own tensor names (fused ``wqkv`` whose q / k
rows are in interleaved-pair RoPE order, which loong's ``moonvit`` computes in as they are).

Names are those transformers' ``save_pretrained`` writes (``language_model.model.blocks.*``,
``vision_tower.encoder.*``, ``model.mm_projector.pre_norm``, ``mm_projector.proj.{0,2}``);
the aliases Moonshot's published directories use (``language_model.model.layers.*``,
``vision_tower.patch_embed.proj``, ``mm_projector.pre_norm``) read too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.deepseek_v3.hf_adapter import DeepSeekV3HFAdapter
from loong_llm.hf.mapping import Rule, RuleSet, Shape
from loong_vlm.hf_adapter import PartsRuleSet, VLMHFAdapter, text_config
from loong_vlm.qwen3_vl.rules import FUSED_QKV, FusedQKVRuleSet

VT, VB = "vision_tower.", "vision_tower.encoder.blocks.{i}."
VL = "encoder.blocks.layers.{i}."
#: stored name prefix -> the name this adapter reads and writes
_ALIASES = (("language_model.model.layers.", "language_model.model.blocks."),
            ("vision_tower.patch_embed.proj.", "vision_tower.encoder.patch_embed.proj."),
            ("mm_projector.pre_norm.", "model.mm_projector.pre_norm."))


def canonical_name(stored: str) -> str:
    """The name of a stored Kimi-K2.5 tensor in the layout ``save_pretrained`` writes."""
    for alias, name in _ALIASES:
        if stored.startswith(alias):
            return name + stored[len(alias):]
    return stored


def _text_name(name: str) -> str:
    """A ``DeepseekV3ForCausalLM`` tensor name inside Kimi-K2.5's layout."""
    name = name.replace("model.layers.", "model.blocks.", 1)
    return "language_model." + name


def _square(vision: dict) -> int:
    side, width = vision.get("pos_emb_height", 64), vision.get("pos_emb_width", 64)
    if side != width:
        raise ConfigError(f"vision_config.pos_emb_height = {side} and pos_emb_width = {width}: MoonViT's position "
                          "table is resampled as a square (transformers does too); they must be equal.")
    return int(side)


class KimiK25HFAdapter(VLMHFAdapter):
    """Kimi-K2.5 checkpoints: ``vision_tower.*``, ``mm_projector.*``, ``language_model.*``."""

    family = "kimi_k25"
    model_types = ("kimi_k25",)
    architecture = "Kimi_K25ForConditionalGeneration"
    text = DeepSeekV3HFAdapter()

    # -- config ----------------------------------------------------------------------------
    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """``{"encoder", "projector", "foundation": {...}, "image_token_id", "video_token_id"}``."""
        text, vision = text_config(hf), dict(hf.get("vision_config") or {})
        if not hf.get("text_config") or not vision:
            raise ConfigError("a Kimi-K2.5 config.json needs text_config and vision_config.")
        if text.get("model_type", "deepseek_v3") not in ("deepseek_v3", "kimi_k2"):
            raise ConfigError(f"text_config.model_type = {text.get('model_type')!r}: Kimi-K2.5 reads a DeepSeek-V3 "
                              "text model.")
        merge = vision.get("merge_kernel_size", [2, 2])
        if len(set(merge)) != 1:
            raise ConfigError(f"vision_config.merge_kernel_size = {merge}: loong merges square blocks only.")
        rope = vision.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ConfigError(f"vision_config.rope_parameters.rope_type = {rope['rope_type']!r}; MoonViT is axial.")
        width = vision.get("hidden_size", 1152)
        if hf.get("projection_hidden_size", width) != width:
            raise ConfigError(f"projection_hidden_size = {hf['projection_hidden_size']} differs from "
                              f"vision_config.hidden_size = {width} (the projector normalises each patch feature).")
        encoder = dict(
            num_layers=vision.get("num_hidden_layers", 27), hidden_size=width,
            num_attention_heads=vision.get("num_attention_heads", 16),
            ffn_hidden_size=vision.get("intermediate_size", 4304),
            hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"), patch_size=vision.get("patch_size", 14),
            spatial_merge_size=int(merge[0]), position_grid=_square(vision),
            num_frame_embeddings=vision.get("pos_emb_time", 4), rope_theta=float(rope.get("rope_theta", 10000.0)))
        projector = dict(spatial_merge_size=int(merge[0]), normalization="LayerNorm",
                         norm_epsilon=hf.get("projection_layer_norm_eps", 1e-5))
        top = {key: hf[key] for key in ("image_token_id", "video_token_id") if key in hf}
        return {"encoder": encoder, "projector": projector, "foundation": self.text.config_from_hf(text), **top}

    def config_to_hf(self, cfg) -> dict[str, Any]:
        e, p, f = cfg.encoder, cfg.projector, cfg.foundation
        text = self.text.config_to_hf(f)
        tie = text.pop("tie_word_embeddings")  # top-level in Kimi-K2.5
        vision = dict(num_hidden_layers=e.num_layers, hidden_size=e.hidden_size,
                      num_attention_heads=e.num_attention_heads, intermediate_size=e.ffn_hidden_size,
                      hidden_act=e.hidden_act, patch_size=e.patch_size,
                      merge_kernel_size=[e.spatial_merge_size] * 2, pos_emb_height=e.position_grid,
                      pos_emb_width=e.position_grid, pos_emb_time=e.num_frame_embeddings,
                      rope_parameters={"rope_type": "axial", "rope_theta": e.rope_theta})
        return {"text_config": {**text, "model_type": "deepseek_v3"},
                "vision_config": {**vision, "model_type": "kimi_k25_vision"},
                "projection_hidden_size": e.hidden_size, "projection_layer_norm_eps": p.norm_epsilon,
                "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
                "tie_word_embeddings": tie}

    # -- tensors ---------------------------------------------------------------------------
    def reader(self, hf_dir: str | Path):
        """The directory's tensors by the names this adapter uses (aliases read too)."""
        from loong_vlm.qwen2_5_vl.hf_load import PublishedNamesReader

        return PublishedNamesReader(str(hf_dir), rename=canonical_name)

    def rules(self, cfg) -> list[Rule]:
        return self.rule_set(cfg).rules

    def rule_set(self, cfg) -> PartsRuleSet:
        e, f = cfg.encoder, cfg.foundation
        text = self.text.rule_set(f)
        text_rules = [dataclasses.replace(rule, loong="language_model." + rule.loong,
                                          hf=tuple(map(_text_name, rule.hf)), also=tuple(map(_text_name, rule.also)))
                      for rule in text.rules]
        shape = Shape(num_heads=e.num_attention_heads, num_groups=e.num_attention_heads,
                      head_dim=e.hidden_size // e.num_attention_heads, vocab_size=0)
        return PartsRuleSet([RuleSet(text_rules, text.shape), FusedQKVRuleSet(vision_rules(), shape)])


def vision_rules() -> list[Rule]:
    """MoonViT's and the projector's tensors."""
    pairs = [("encoder.pos_embed", VT + "patch_embed.pos_emb.weight")]
    for param in ("weight", "bias"):
        pairs += [(f"encoder.patch_embed.{param}", f"{VT}encoder.patch_embed.proj.{param}"),
                  (f"encoder.final_layernorm.{param}", f"{VT}encoder.final_layernorm.{param}"),
                  (f"{VL}input_layernorm.{param}", f"{VB}norm0.{param}"),
                  (f"{VL}self_attention.linear_proj.{param}", f"{VB}wo.{param}"),
                  (f"{VL}pre_mlp_layernorm.{param}", f"{VB}norm1.{param}"),
                  (f"{VL}mlp.linear_fc1.{param}", f"{VB}mlp.fc0.{param}"),
                  (f"{VL}mlp.linear_fc2.{param}", f"{VB}mlp.fc1.{param}"),
                  (f"projector.norm.{param}", f"model.mm_projector.pre_norm.{param}"),
                  (f"projector.linear_fc1.{param}", f"mm_projector.proj.0.{param}"),
                  (f"projector.linear_fc2.{param}", f"mm_projector.proj.2.{param}")]
    rules = [Rule(loong, (hf,)) for loong, hf in pairs]
    rules += [Rule(f"{VL}self_attention.linear_qkv.{param}", (f"{VB}wqkv.{param}",), FUSED_QKV)
              for param in ("weight", "bias")]
    return rules
