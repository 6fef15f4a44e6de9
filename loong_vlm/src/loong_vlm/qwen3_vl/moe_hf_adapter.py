"""HF <-> loong for Qwen3-VL-MoE (``Qwen3VLMoeForConditionalGeneration``): Qwen3-VL's vision
tower and table, with loong_llm's ``qwen3_moe`` table for the text decoder. The checkpoints stack
each layer's experts (``mlp.experts.gate_up_proj`` / ``down_proj``), read and written through
:mod:`loong_llm.hf.stacked_experts`; the router always renormalises its top-k weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loong_llm.families.qwen3_moe.hf_adapter import Qwen3MoEHFAdapter
from loong_llm.hf.adapter import read_hf_config
from loong_llm.hf.io import SafetensorsReader
from loong_llm.hf.stacked_experts import ExpertStacker, StackedExpertsReader
from loong_vlm.qwen3_vl.hf_adapter import Qwen3VLHFAdapter

#: text_config keys of Qwen3-MoE that Qwen3-VL-MoE's text config does not have.
_NOT_IN_TEXT_CONFIG = ("norm_topk_prob",)


class Qwen3VLMoeHFAdapter(Qwen3VLHFAdapter):
    """Qwen3-VL-MoE checkpoints: ``model.visual.*``, ``model.language_model.*`` (MoE layers with
    stacked experts), ``lm_head``."""

    family = "qwen3_vl_moe"
    model_types = ("qwen3_vl_moe",)
    architecture = "Qwen3VLMoeForConditionalGeneration"
    text = Qwen3MoEHFAdapter()
    text_model_type, vision_model_type = "qwen3_vl_moe_text", "qwen3_vl_moe_vision"

    def config_from_hf(self, hf: dict) -> dict[str, Any]:
        text = {**(hf.get("text_config") or {}), "norm_topk_prob": True}
        return super().config_from_hf({**hf, "text_config": text})

    def config_to_hf(self, cfg) -> dict[str, Any]:
        out = super().config_to_hf(cfg)
        text = out["text_config"]
        for key in _NOT_IN_TEXT_CONFIG:
            text.pop(key, None)
        text["num_local_experts"] = text.pop("num_experts")  # the key transformers saves
        return out

    def reader(self, hf_dir: str | Path) -> StackedExpertsReader:
        """The checkpoint's tensors with each stacked expert tensor also served per expert."""
        hidden = read_hf_config(hf_dir)["text_config"]["hidden_size"]
        return StackedExpertsReader(SafetensorsReader(hf_dir), hidden)

    def export_stacker(self, cfg) -> ExpertStacker:
        return ExpertStacker(cfg.foundation.num_experts)
