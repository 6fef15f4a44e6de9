"""HF <-> loong mapping of the Qwen3 dense family (``Qwen3ForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter


class Qwen3HFAdapter(DecoderHFAdapter):
    """Qwen3 checkpoints: Llama names plus ``self_attn.q_norm`` / ``k_norm``."""

    family = "qwen3"
    model_types = ("qwen3",)
    architecture = "Qwen3ForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("attention_bias"):
            raise ConfigError("attention_bias=true is not supported by the 'qwen3' family.")
        if hf.get("use_sliding_window"):
            raise ConfigError("use_sliding_window=true is not supported by the 'qwen3' family.")
        return {**super().config_from_hf(hf), "add_qkv_bias": False, "qk_layernorm": True}

    def config_to_hf(self, cfg) -> dict:
        return {**super().config_to_hf(cfg), "attention_bias": False, "use_sliding_window": False}
