"""HF <-> loong mapping of the Llama family (``LlamaForCausalLM``)."""

from __future__ import annotations

from loong_core.errors import ConfigError
from loong_llm.families.common.hf_adapter import DecoderHFAdapter


class LlamaHFAdapter(DecoderHFAdapter):
    """Llama 2 / 3 / 3.1 checkpoints; llama3 RoPE scaling comes from ``rope_parameters``."""

    family = "llama"
    model_types = ("llama",)
    architecture = "LlamaForCausalLM"

    def config_from_hf(self, hf: dict) -> dict:
        if hf.get("attention_bias"):
            raise ConfigError("attention_bias=true (bias on q/k/v/o) is not supported by the "
                              "'llama' family; Qwen2-style qkv-only bias is the 'qwen2' family.")
        return super().config_from_hf(hf)

    def config_to_hf(self, cfg) -> dict:
        if cfg.add_qkv_bias or cfg.qk_layernorm:
            raise ConfigError("a Llama checkpoint has no qkv bias or q/k norm; export this model "
                              "with the 'qwen2' / 'qwen3' family instead.")
        return {**super().config_to_hf(cfg), "attention_bias": False, "mlp_bias": False}
