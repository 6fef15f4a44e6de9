"""HF <-> loong for InternVL (``InternVLForConditionalGeneration``, transformers' ``internvl``):
config and every tensor. The text decoder is read by the loong_llm family of its
``text_config.model_type`` (Qwen2 for InternVL 2.5 / 3, Qwen3 for InternVL 3.5, ...), under the
composed model's prefixes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.hf.mapping import Rule, RuleSet, Shape
from loong_llm.hf.registry import family_for_model_type, get_adapter
from loong_vlm.hf_adapter import PartsRuleSet, VLMHFAdapter, text_config

VT, VL = "vision_tower.", "encoder.blocks.layers.{i}."
HL = VT + "encoder.layer.{i}."
_NORMS = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}
#: settings of transformers' InternVL that loong reads only at these values: key -> (value, why)
_FIXED_VISION = {"hidden_act": ("gelu", "the exact GELU"),
                 "use_absolute_position_embeddings": (True, "learned absolute positions"),
                 "use_mask_token": (False, "no mask token (masked-image pre-training)")}
_FIXED_TOP = {"vision_feature_layer": (-1, "features of the last vision block"),
              "vision_feature_select_strategy": ("default", "the class token dropped")}


def _side(value, key: str) -> int:
    """A square size from an int or ``[h, w]``."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ConfigError(f"vision_config.{key} = {value}: loong reads square tiles only.")
        return int(value[0])
    return int(value)


def _check_fixed(hf: dict, fixed: dict, where: str) -> None:
    for key, (value, what) in fixed.items():
        if key in hf and hf[key] != value:
            raise ConfigError(f"{where}{key} = {hf[key]!r} is not supported: loong's InternVL reads {value!r} "
                              f"({what}).")


def published_name(stored: str) -> str:
    """The published name of an InternVL tensor saved under transformers 5's module names
    (``model.vision_tower.*`` -> ``vision_tower.*``, ``model.language_model.*`` ->
    ``language_model.model.*``, ``lm_head.*`` -> ``language_model.lm_head.*``)."""
    for prefix in ("model.vision_tower.", "model.multi_modal_projector."):
        if stored.startswith(prefix):
            return stored[len("model."):]
    if stored.startswith("model.language_model."):
        return "language_model.model." + stored[len("model.language_model."):]
    if stored.startswith("lm_head."):
        return "language_model." + stored
    return stored


def _text_name(name: str) -> str:
    """A ``<Text>ForCausalLM`` tensor name inside InternVL's published layout."""
    return "language_model." + name


class InternVLHFAdapter(VLMHFAdapter):
    """InternVL checkpoints in the published layout (what ``save_pretrained`` writes):
    ``vision_tower.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
    ``language_model.lm_head``; a directory saved under transformers 5's module names
    (``model.vision_tower.*``, ...) reads too."""

    family = "internvl"
    model_types = ("internvl",)
    architecture = "InternVLForConditionalGeneration"

    # -- config ----------------------------------------------------------------------------
    @staticmethod
    def text_adapter(foundation_family: str):
        """The loong_llm adapter of the foundation's family."""
        return get_adapter(foundation_family)

    @staticmethod
    def foundation_family(hf: dict) -> str:
        """The loong_llm family of ``text_config.model_type``."""
        text, vision = hf.get("text_config") or {}, hf.get("vision_config") or {}
        if not text or not vision:
            raise ConfigError("an InternVL config.json needs text_config and vision_config.")
        return family_for_model_type(text.get("model_type"), "text_config of an InternVL config.json")

    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """``{"encoder", "projector", "foundation": {...}, "image_token_id"}``."""
        family = self.foundation_family(hf)
        text, vision = text_config(hf), dict(hf["vision_config"])
        _check_fixed(vision, _FIXED_VISION, "vision_config.")
        _check_fixed(hf, _FIXED_TOP, "")
        foundation = self.text_adapter(family).config_from_hf(text)
        ratio = float(hf.get("downsample_ratio", 0.5))
        merge = round(1 / ratio)
        if abs(merge * ratio - 1) > 1e-9:
            raise ConfigError(f"downsample_ratio = {ratio} is not 1 / an integer.")
        encoder = dict(
            num_layers=vision["num_hidden_layers"], hidden_size=vision["hidden_size"],
            num_attention_heads=vision["num_attention_heads"], ffn_hidden_size=vision["intermediate_size"],
            image_size=_side(vision.get("image_size", 448), "image_size"),
            patch_size=_side(vision.get("patch_size", 14), "patch_size"),
            num_channels=vision.get("num_channels", 3), norm_epsilon=vision.get("layer_norm_eps", 1e-6),
            normalization=_NORMS[vision.get("norm_type", "layer_norm")],
            qk_layernorm=bool(vision.get("use_qk_norm", False)),
            layer_scale_init=vision.get("layer_scale_init_value", 0.1),
            final_layernorm=not vision.get("use_mean_pooling", True),
            attention_bias=bool(vision.get("attention_bias", False)))
        projector = dict(spatial_merge_size=merge, activation=hf.get("projector_hidden_act", "gelu"),
                         ffn_hidden_size=foundation["hidden_size"], norm_after_merge=True, norm_epsilon=1e-5,
                         pre_norm=True)
        top = {"image_token_id": hf["image_token_id"]} if "image_token_id" in hf else {}
        return {"encoder": encoder, "projector": projector, "foundation": foundation, **top}

    def apply_hf_config(self, cfg, hf_dir: str | Path) -> None:
        """The parts' fields from config.json; the foundation becomes the family its
        ``text_config.model_type`` names (a ``qwen3`` text model under a ``qwen2`` YAML too)."""
        from loong_llm.hf.adapter import read_hf_config

        family = self.foundation_family(read_hf_config(hf_dir))
        if cfg.foundation.name != family:
            cfg.foundation = _fresh_config(family)
        super().apply_hf_config(cfg, hf_dir)

    def config_to_hf(self, cfg) -> dict[str, Any]:
        e, p, f = cfg.encoder, cfg.projector, cfg.foundation
        text_adapter = self.text_adapter(f.name)
        text = text_adapter.config_to_hf(f)
        tie = text.pop("tie_word_embeddings")  # top-level in InternVL
        norm = {v: k for k, v in _NORMS.items()}[e.normalization]
        vision = dict(
            num_hidden_layers=e.num_layers, hidden_size=e.hidden_size, num_attention_heads=e.num_attention_heads,
            intermediate_size=e.ffn_hidden_size or 4 * e.hidden_size, image_size=[e.image_size, e.image_size],
            patch_size=[e.patch_size, e.patch_size], num_channels=e.num_channels, layer_norm_eps=e.norm_epsilon,
            norm_type=norm, use_qk_norm=e.qk_layernorm, layer_scale_init_value=e.layer_scale_init,
            use_mean_pooling=not e.final_layernorm, attention_bias=e.attention_bias, hidden_act="gelu")
        rows, cols = e.grid()
        return {"text_config": {**text, "model_type": text_adapter.model_types[0]},
                "vision_config": {**vision, "model_type": "internvl_vision"},
                "downsample_ratio": 1 / p.spatial_merge_size, "projector_hidden_act": p.activation,
                "vision_feature_layer": -1, "vision_feature_select_strategy": "default",
                "image_token_id": cfg.image_token_id,
                "image_seq_length": rows * cols // p.spatial_merge_size ** 2, "tie_word_embeddings": tie}

    # -- tensors ---------------------------------------------------------------------------
    def reader(self, hf_dir: str | Path):
        """The directory's tensors by their published names."""
        from loong_vlm.qwen2_5_vl.hf_load import PublishedNamesReader

        return PublishedNamesReader(str(hf_dir), rename=published_name)

    def rules(self, cfg) -> list[Rule]:
        return self.rule_set(cfg).rules

    def rule_set(self, cfg) -> PartsRuleSet:
        e, f = cfg.encoder, cfg.foundation
        text_rules = [dataclasses.replace(rule, loong="language_model." + rule.loong,
                                          hf=tuple(map(_text_name, rule.hf)))
                      for rule in self.text_adapter(f.name).rules(f)]
        text_shape = Shape(num_heads=f.num_attention_heads, num_groups=f.num_query_groups or f.num_attention_heads,
                           head_dim=f.head_dim(), vocab_size=f.vocab_size)
        vision_shape = Shape(num_heads=e.num_attention_heads, num_groups=e.num_attention_heads,
                             head_dim=e.hidden_size // e.num_attention_heads, vocab_size=0)
        return PartsRuleSet([RuleSet(text_rules, text_shape), RuleSet(vision_rules(e), vision_shape)])


def vision_rules(e) -> list[Rule]:
    """InternViT's and the projector's tensors."""
    emb, params = VT + "embeddings.", ("weight", "bias") if e.normalization == "LayerNorm" else ("weight",)
    pairs = [("encoder.cls_token", emb + "cls_token"), ("encoder.position_embeddings", emb + "position_embeddings"),
             ("encoder.patch_embed.weight", emb + "patch_embeddings.projection.weight"),
             ("encoder.patch_embed.bias", emb + "patch_embeddings.projection.bias"),
             (VL + "self_attention.linear_proj.layer_scale", HL + "lambda_1"),
             (VL + "mlp.linear_fc2.layer_scale", HL + "lambda_2")]
    for param in ("weight", "bias"):
        pairs += [(VL + f"self_attention.linear_proj.{param}", HL + f"attention.projection_layer.{param}"),
                  (VL + f"mlp.linear_fc1.{param}", HL + f"mlp.fc1.{param}"),
                  (VL + f"mlp.linear_fc2.{param}", HL + f"mlp.fc2.{param}"),
                  (f"projector.norm.{param}", f"multi_modal_projector.layer_norm.{param}"),
                  (f"projector.linear_fc1.{param}", f"multi_modal_projector.linear_1.{param}"),
                  (f"projector.linear_fc2.{param}", f"multi_modal_projector.linear_2.{param}")]
    for param in params:
        pairs += [(VL + f"input_layernorm.{param}", HL + f"layernorm_before.{param}"),
                  (VL + f"pre_mlp_layernorm.{param}", HL + f"layernorm_after.{param}")]

    if e.final_layernorm:  # a LayerNorm whatever the blocks' normalization
        pairs += [(f"encoder.final_layernorm.{param}", VT + f"layernorm.{param}") for param in ("weight", "bias")]
    if e.qk_layernorm:
        pairs += [(VL + "self_attention.q_layernorm.weight", HL + "attention.q_norm.weight"),
                  (VL + "self_attention.k_layernorm.weight", HL + "attention.k_norm.weight")]
    rules = [Rule(loong, (hf,)) for loong, hf in pairs]
    rules += [Rule(VL + f"self_attention.linear_qkv.{param}",
                   tuple(HL + f"attention.{x}_proj.{param}" for x in "qkv"), "qkv")
              for param in (("weight", "bias") if e.attention_bias else ("weight",))]
    return rules


def _fresh_config(family: str):
    """A default config of the registered model ``family``."""
    from loong_core.plugins import get_plugin_system

    entry = get_plugin_system().registry().get("model", family, "model.foundation.name")
    return entry.load_meta("config")(name=family)
