"""HF <-> loong mapping of the Qwen3.5 dense text family (``Qwen3_5ForCausalLM``)."""

from __future__ import annotations

from loong_llm.families.qwen3_next.hf_adapter import Qwen3NextHFAdapter


class Qwen3_5HFAdapter(Qwen3NextHFAdapter):
    """Qwen3.5 text checkpoints: Qwen3-Next's names, except the Gated DeltaNet input projections
    (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), and a dense MLP per layer."""

    family = "qwen3_5"
    model_types = ("qwen3_5_text",)
    architecture = "Qwen3_5ForCausalLM"
    split_projections = True
    moe = False
