"""HF <-> loong for Qwen3-VL (``Qwen3VLForConditionalGeneration``): config and every tensor,
vision tower (blocks, merger, deepstack mergers) included. The text decoder is a Qwen3 dense
model: its table is loong_llm's ``qwen3`` table under the composed model's prefixes."""

from __future__ import annotations

import dataclasses
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.qwen3.hf_adapter import Qwen3HFAdapter
from loong_llm.hf.mapping import Rule, RuleSet, Shape
from loong_vlm.hf_adapter import PartsRuleSet, VLMHFAdapter, text_config, text_hf_name
from loong_vlm.qwen3_vl.rules import vision_rule_set

#: loong ``qwen3_vit`` field -> HF ``vision_config`` key.
_VISION_FIELDS = {"num_layers": "depth", "hidden_size": "hidden_size", "num_attention_heads": "num_heads",
                  "ffn_hidden_size": "intermediate_size", "hidden_act": "hidden_act",
                  "num_channels": "in_channels", "patch_size": "patch_size",
                  "temporal_patch_size": "temporal_patch_size", "spatial_merge_size": "spatial_merge_size",
                  "out_hidden_size": "out_hidden_size", "num_position_embeddings": "num_position_embeddings",
                  "deepstack_visual_indexes": "deepstack_visual_indexes"}
_TOP_FIELDS = ("image_token_id", "video_token_id")


class Qwen3VLHFAdapter(VLMHFAdapter):
    """Qwen3-VL checkpoints: ``model.visual.*``, ``model.language_model.*``, ``lm_head``."""

    family = "qwen3_vl"
    model_types = ("qwen3_vl",)
    architecture = "Qwen3VLForConditionalGeneration"
    text = Qwen3HFAdapter()
    text_model_type, vision_model_type = "qwen3_vl_text", "qwen3_vl_vision"

    # -- config ----------------------------------------------------------------------------
    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """``{"encoder": {...}, "foundation": {...}, "image_token_id", "video_token_id"}``."""
        text, vision = text_config(hf), dict(hf.get("vision_config") or {})
        if not hf.get("text_config") or not vision:
            raise ConfigError("a Qwen3-VL config.json needs text_config and vision_config.")
        foundation = self.text.config_from_hf(text)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        foundation.update(position_embedding_type="mrope", mrope_section=list(rope.get("mrope_section", [24, 20, 20])))
        encoder = {loong: vision[key] for loong, key in _VISION_FIELDS.items() if key in vision}
        encoder["deepstack_visual_indexes"] = list(encoder.get("deepstack_visual_indexes", []))
        encoder["rope_theta"] = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        if encoder.get("out_hidden_size", foundation["hidden_size"]) != foundation["hidden_size"]:
            raise ConfigError(f"vision_config.out_hidden_size {encoder['out_hidden_size']} differs from "
                              f"text_config.hidden_size {foundation['hidden_size']}.")
        return {"encoder": encoder, "foundation": foundation, **{k: hf[k] for k in _TOP_FIELDS if k in hf}}

    def config_to_hf(self, cfg) -> dict[str, Any]:
        f, e = cfg.foundation, cfg.encoder
        text = self.text.config_to_hf(f)
        tie = text.pop("tie_word_embeddings")  # top-level in Qwen3-VL
        text.pop("use_sliding_window", None)  # not a Qwen3-VL text field
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": list(f.mrope_section),
                                   "mrope_interleaved": True}
        vision = {key: getattr(e, loong) for loong, key in _VISION_FIELDS.items()}
        vision["deepstack_visual_indexes"] = list(e.deepstack_visual_indexes)
        vision["rope_parameters"] = {"rope_type": "axial", "rope_theta": e.rope_theta}
        return {"text_config": {**text, "model_type": self.text_model_type},
                "vision_config": {**vision, "model_type": self.vision_model_type},
                "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
                "tie_word_embeddings": tie}

    # -- tensors ---------------------------------------------------------------------------
    def rules(self, cfg) -> list[Rule]:
        return self.rule_set(cfg).rules

    def rule_set(self, cfg) -> PartsRuleSet:
        f, e = cfg.foundation, cfg.encoder
        text_rules = [dataclasses.replace(rule, loong="language_model." + rule.loong,
                                          hf=tuple(map(text_hf_name, rule.hf)))
                      for rule in self.text.rules(f)]
        shape = Shape(num_heads=f.num_attention_heads, num_groups=f.num_query_groups or f.num_attention_heads,
                      head_dim=f.head_dim(), vocab_size=f.vocab_size,
                      num_experts=getattr(f, "num_experts", 0) or 0)
        vision = vision_rule_set(e.num_attention_heads, e.hidden_size // e.num_attention_heads,
                                 len(e.deepstack_visual_indexes))
        return PartsRuleSet([RuleSet(text_rules, shape), vision])
