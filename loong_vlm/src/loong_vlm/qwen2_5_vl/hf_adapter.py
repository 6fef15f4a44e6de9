"""HF <-> loong mapping of Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``), vision tower included.

Names on the HF side are those ``save_pretrained`` writes and the published checkpoints use:
``model.*`` / ``lm_head`` for the decoder, ``visual.*`` for the tower and merger. Loong names are
the composed model's: ``language_model.*`` (a GPTModel), ``encoder.*``, ``projector.*``.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.qwen2.hf_adapter import Qwen2HFAdapter
from loong_llm.hf.adapter import HFAdapter, read_hf_config
from loong_llm.hf.mapping import Rule, RuleSet, Shape
from loong_vlm.hf_adapter import text_config

V = "visual.blocks.{i}."
E = "encoder.blocks.layers.{i}."


class VisionRuleSet(RuleSet):
    """Rules with two more transforms for the vision tower.

    - ``vit_qkv``: HF's fused ``qkv`` ([Q; K; V] rows) into megatron-core's per-head
      [q_h; k_h; v_h] layout (multi-head attention: one group per head).
    - ``patch``: the Conv3d kernel ``[hidden, C, T, P, P]`` as the linear patch embedding
      ``[hidden, C*T*P*P]``.
    """

    def __init__(self, rules: list[Rule], shape: Shape, vision: Shape, kernel: tuple[int, ...]):
        super().__init__(rules, shape)
        self.vision, self.kernel = vision, kernel

    def to_loong(self, rule: Rule, tensors: list, rows: int | None = None):
        if rule.kind == "vit_qkv":
            qkv = RuleSet(self.rules, self.vision)
            return qkv.to_loong(replace(rule, kind="qkv"), list(tensors[0].chunk(3, dim=0)))
        if rule.kind == "patch":
            return tensors[0].reshape(tensors[0].shape[0], -1)
        return super().to_loong(rule, tensors, rows)

    def to_hf(self, rule: Rule, full) -> list:
        import torch

        if rule.kind == "vit_qkv":
            parts = RuleSet(self.rules, self.vision).to_hf(replace(rule, kind="qkv"), full)
            return [torch.cat(parts, dim=0)]
        if rule.kind == "patch":
            return [full.reshape(full.shape[0], *self.kernel)]
        return super().to_hf(rule, full)


def _text_config(hf: dict) -> dict:
    """The decoder's HF config (``text_config``, or the top level of older config.json files)
    with the MRoPE section taken out of its RoPE parameters."""
    text = text_config(hf) if hf.get("text_config") else dict(hf)
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = params.pop("mrope_section", None)
    if section is None:
        raise ConfigError("config.json of a Qwen2.5-VL model has no mrope_section in its RoPE parameters.")
    params.pop("type", None)
    theta = params.get("rope_theta", text.get("rope_theta", 1000000.0))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    text.pop("rope_scaling", None)
    text["mrope_section"] = list(section)
    text.setdefault("tie_word_embeddings", False)
    return text


class Qwen25VLHFAdapter(HFAdapter):
    """Qwen2.5-VL checkpoints: a Qwen2 decoder with MRoPE, the window-attention ViT and merger."""

    family = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    architecture = "Qwen2_5_VLForConditionalGeneration"
    text = Qwen2HFAdapter()

    # -- config ----------------------------------------------------------------------------
    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        """``{"foundation": {...}, "encoder": {...}, "projector": {...}, token ids}``."""
        text = _text_config(hf)
        v = hf.get("vision_config") or {}
        if v.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"vision_config.hidden_act={v['hidden_act']!r} is not supported (silu only).")
        if v.get("out_hidden_size", text["hidden_size"]) != text["hidden_size"]:
            raise ConfigError("vision_config.out_hidden_size must equal the decoder's hidden_size.")
        foundation = {**self.text.config_from_hf(text), "position_embedding_type": "mrope",
                      "mrope_section": text["mrope_section"]}
        rope = v.get("rope_parameters") or {}
        encoder = dict(
            num_layers=v["depth"], hidden_size=v["hidden_size"], num_attention_heads=v["num_heads"],
            ffn_hidden_size=v["intermediate_size"],
            num_channels=v.get("in_channels", v.get("in_chans", 3)), patch_size=v["patch_size"],
            temporal_patch_size=v["temporal_patch_size"], spatial_merge_size=v["spatial_merge_size"],
            window_size=v["window_size"], fullatt_block_indexes=list(v["fullatt_block_indexes"]),
            tokens_per_second=int(v.get("tokens_per_second", 2)),
            rope_theta=float(rope.get("rope_theta", 10000.0)))
        return dict(foundation=foundation, encoder=encoder,
                    projector=dict(spatial_merge_size=v["spatial_merge_size"]),
                    image_token_id=hf.get("image_token_id"), video_token_id=hf.get("video_token_id"))

    def apply_hf_config(self, cfg, hf_dir: str | Path) -> None:
        """Overwrite the architecture fields of ``cfg`` and its parts with ``hf_dir``'s."""
        hf = read_hf_config(hf_dir)
        self.check_model_type(hf, str(Path(hf_dir) / "config.json"))
        for key, value in self.config_from_hf(hf).items():
            if isinstance(value, dict):
                part = getattr(cfg, key)
                for field, sub in value.items():
                    setattr(part, field, sub)
            elif value is not None:
                setattr(cfg, key, value)

    def config_to_hf(self, cfg) -> dict[str, Any]:
        f, e = cfg.foundation, cfg.encoder
        text = self.text.config_to_hf(f)
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": list(f.mrope_section)}
        text["model_type"] = "qwen2_5_vl_text"
        vision = dict(
            depth=e.num_layers, hidden_size=e.hidden_size, num_heads=e.num_attention_heads,
            intermediate_size=e.ffn_hidden_size, in_channels=e.num_channels, patch_size=e.patch_size,
            temporal_patch_size=e.temporal_patch_size, spatial_merge_size=e.spatial_merge_size,
            window_size=e.window_size, fullatt_block_indexes=list(e.fullatt_block_indexes),
            tokens_per_second=e.tokens_per_second, out_hidden_size=f.hidden_size, hidden_act="silu",
            rope_parameters={"rope_type": "axial", "rope_theta": e.rope_theta},
            model_type="qwen2_5_vl_vision")
        return {"text_config": text, "vision_config": vision, "image_token_id": cfg.image_token_id,
                "video_token_id": cfg.video_token_id, "tie_word_embeddings": text["tie_word_embeddings"]}

    def full_hf_config(self, cfg, base: dict | None, dtype: str) -> dict:
        """The source config.json (nested sections updated, not replaced) with loong's fields."""
        out = copy.deepcopy(base or {})
        for key, value in self.config_to_hf(cfg).items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key].update(value)
            else:
                out[key] = value
        out.update(architectures=[self.architecture], model_type=self.model_types[0], dtype=dtype)
        out.pop("torch_dtype", None)
        return out

    # -- tensors ---------------------------------------------------------------------------
    def vision_rules(self, cfg) -> list[Rule]:
        """Patch embedding, ViT layers (``encoder.*``) and merger (``projector.*``)."""
        rules = [Rule("encoder.patch_embed.weight", ("visual.patch_embed.proj.weight",), "patch")]
        for loong, hf in (("input_layernorm.weight", "norm1.weight"),
                          ("pre_mlp_layernorm.weight", "norm2.weight"),
                          ("self_attention.linear_proj.weight", "attn.proj.weight"),
                          ("self_attention.linear_proj.bias", "attn.proj.bias"),
                          ("mlp.linear_fc2.weight", "mlp.down_proj.weight"),
                          ("mlp.linear_fc2.bias", "mlp.down_proj.bias")):
            rules.append(Rule(E + loong, (V + hf,)))
        for suffix in ("weight", "bias"):
            rules += [Rule(E + f"self_attention.linear_qkv.{suffix}", (V + f"attn.qkv.{suffix}",), "vit_qkv"),
                      Rule(E + f"mlp.linear_fc1.{suffix}",
                           (V + f"mlp.gate_proj.{suffix}", V + f"mlp.up_proj.{suffix}"), "gate_up"),
                      Rule(f"projector.linear_fc1.{suffix}", (f"visual.merger.mlp.0.{suffix}",)),
                      Rule(f"projector.linear_fc2.{suffix}", (f"visual.merger.mlp.2.{suffix}",))]
        rules.append(Rule("projector.norm.weight", ("visual.merger.ln_q.weight",)))
        return rules

    def rules(self, cfg) -> list[Rule]:
        text = [replace(rule, loong="language_model." + rule.loong) for rule in self.text.rules(cfg.foundation)]
        return text + self.vision_rules(cfg)

    def rule_set(self, cfg) -> VisionRuleSet:
        f, e = cfg.foundation, cfg.encoder
        shape = Shape(num_heads=f.num_attention_heads, num_groups=f.num_query_groups or f.num_attention_heads,
                      head_dim=f.head_dim(), vocab_size=f.vocab_size)
        heads = e.num_attention_heads
        vision = Shape(num_heads=heads, num_groups=heads, head_dim=e.hidden_size // heads, vocab_size=0)
        kernel = (e.num_channels, e.temporal_patch_size, e.patch_size, e.patch_size)
        return VisionRuleSet(self.rules(cfg), shape, vision, kernel)
