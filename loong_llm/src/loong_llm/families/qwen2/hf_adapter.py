"""HF <-> loong mapping of the Qwen2 / Qwen2.5 family (``Qwen2ForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter


class Qwen2HFAdapter(DecoderHFAdapter):
    """Qwen2 checkpoints: Llama names plus ``q_proj/k_proj/v_proj.bias``."""

    family = "qwen2"
    model_types = ("qwen2",)
    architecture = "Qwen2ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("use_sliding_window"):
            raise ConfigError("use_sliding_window=true is not supported by the 'qwen2' family.")
        return {**super().config_from_hf(hf), "add_qkv_bias": True, "qk_layernorm": False}

    def config_to_hf(self, cfg) -> dict:
        return {**super().config_to_hf(cfg), "use_sliding_window": False}
