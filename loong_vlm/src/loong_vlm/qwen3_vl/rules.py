"""HF <-> loong name mapping of Qwen3-VL's vision tower (its fused ``[q; k; v]`` projections)."""

from __future__ import annotations

from loong_llm.hf.mapping import Rule, RuleSet, Shape

VL = "encoder.blocks.layers.{i}."
VH = "blocks.{i}."
#: Loong kind of a ``[q; k; v]`` stacked HF projection (one tensor, three equal row blocks).
FUSED_QKV = "qkv_fused"


def vision_rules(hf_prefix: str = "model.visual.", loong_prefix: str = "encoder.",
                 num_deepstack: int = 0) -> list[Rule]:
    """Rules of the ``qwen3_vit`` encoder (its merger and deepstack mergers included)."""
    pairs = [("patch_embed.weight", "patch_embed.proj.weight"), ("patch_embed.bias", "patch_embed.proj.bias"),
             ("pos_embed.weight", "pos_embed.weight")]
    for param in ("weight", "bias"):
        pairs += [
            (f"blocks.layers.{{i}}.input_layernorm.{param}", f"{VH}norm1.{param}"),
            (f"blocks.layers.{{i}}.self_attention.linear_proj.{param}", f"{VH}attn.proj.{param}"),
            (f"blocks.layers.{{i}}.pre_mlp_layernorm.{param}", f"{VH}norm2.{param}"),
            (f"blocks.layers.{{i}}.mlp.linear_fc1.{param}", f"{VH}mlp.linear_fc1.{param}"),
            (f"blocks.layers.{{i}}.mlp.linear_fc2.{param}", f"{VH}mlp.linear_fc2.{param}"),
        ]
        mergers = [("merger.", "merger.")]
        mergers += [(f"deepstack_mergers.{k}.", f"deepstack_merger_list.{k}.") for k in range(num_deepstack)]
        for loong, hf in mergers:
            pairs += [(f"{loong}{part}.{param}", f"{hf}{part}.{param}")
                      for part in ("norm", "linear_fc1", "linear_fc2")]
    rules = [Rule(loong_prefix + loong, (hf_prefix + hf,)) for loong, hf in pairs]
    rules += [Rule(f"{loong_prefix}blocks.layers.{{i}}.self_attention.linear_qkv.{param}",
                   (f"{hf_prefix}{VH}attn.qkv.{param}",), FUSED_QKV) for param in ("weight", "bias")]
    return rules


class FusedQKVRuleSet(RuleSet):
    """A rule set that also knows ``qkv_fused``: HF's ``[q; k; v]`` rows regrouped per head into
    megatron-core's layout (and back)."""

    def to_loong(self, rule: Rule, tensors: list, rows: int | None = None):
        if rule.kind != FUSED_QKV:
            return super().to_loong(rule, tensors, rows)
        return super().to_loong(Rule(rule.loong, rule.hf * 3, "qkv"), list(tensors[0].chunk(3, dim=0)))

    def to_hf(self, rule: Rule, full) -> list:
        if rule.kind != FUSED_QKV:
            return super().to_hf(rule, full)
        import torch

        return [torch.cat(super().to_hf(Rule(rule.loong, rule.hf * 3, "qkv"), full), dim=0)]


def vision_rule_set(num_heads: int, head_dim: int, num_deepstack: int, hf_prefix: str = "model.visual.",
                    loong_prefix: str = "encoder.") -> FusedQKVRuleSet:
    """The vision tower's rule set (multi-head attention: one key/value head per query head)."""
    shape = Shape(num_heads=num_heads, num_groups=num_heads, head_dim=head_dim, vocab_size=0)
    return FusedQKVRuleSet(vision_rules(hf_prefix, loong_prefix, num_deepstack), shape)
