"""The ``qwen2_5_vl`` model: the ``vlm`` composer fixed to Qwen2.5-VL's parts, with HF init."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_vlm.provider import VLMProvider
from loong_vlm.qwen2_5_vl.config import Qwen25VLConfig

FAMILY = "qwen2_5_vl"


class Qwen25VLProvider(VLMProvider):
    """Qwen2.5-VL: ``qwen2_5_vit`` -> ``qwen2_5_merger`` -> Qwen2.5 decoder with MRoPE.

    ``model.init_from_hf`` (an HF ``Qwen2_5_VLForConditionalGeneration`` directory) sets the
    architecture from its config.json and loads every weight, vision tower included.
    """

    family = FAMILY
    config: Qwen25VLConfig

    def __init__(self, config: Qwen25VLConfig):
        if config.init_from_hf:
            from loong_llm.hf.registry import get_adapter

            get_adapter(self.family).apply_hf_config(config, config.init_from_hf)
        super().__init__(config)

    def apply_data_overrides(self, overrides: dict[str, Any]) -> None:
        """As :class:`~loong_vlm.provider.VLMProvider`, but a model whose vocabulary is known (from
        ``model.init_from_hf`` or set) keeps it: the data's tokenizer must fit in it, so that HF
        weights and converted checkpoints load into the same embedding shape."""
        overrides = dict(overrides)
        data_vocab = overrides.get("vocab_size")
        model_vocab = self.config.foundation.vocab_size
        if data_vocab is not None and model_vocab is not None:
            overrides.pop("vocab_size")
            if data_vocab > model_vocab:
                source = self.config.init_from_hf or "model.foundation.vocab_size"
                raise ConfigError(
                    f"the dataset's tokenizer has {data_vocab} tokens but the model ({source}) has "
                    f"vocab_size {model_vocab}; use the model's tokenizer for the data or raise "
                    f"model.foundation.vocab_size.")
        super().apply_data_overrides(overrides)

    def initialize_weights(self, chunks: list[Any]) -> None:
        """Load ``model.init_from_hf`` into every part this rank holds (random init otherwise)."""
        if not self.config.init_from_hf:
            super().initialize_weights(chunks)
            return
        from loong_llm.hf.registry import get_adapter
        from loong_vlm.qwen2_5_vl.hf_load import load_hf_into_vlm_chunks

        load_hf_into_vlm_chunks(get_adapter(self.family), self.config, chunks, self.config.init_from_hf)
        self.attach_adapters(chunks)

    def hf_parts(self, chunks: list[Any]):
        """The :class:`~loong_vlm.qwen2_5_vl.hf_load.VLMParts` of ``model.init_from_hf``
        (streaming converter)."""
        from loong_llm.hf.registry import get_adapter
        from loong_vlm.qwen2_5_vl.hf_load import VLMParts

        return VLMParts(get_adapter(self.family), self.config, chunks, self.config.init_from_hf)

    def attach_adapters(self, chunks: list[Any]) -> None:
        """The foundation's LoRA adapters (``model.foundation.lora``), if enabled."""
        self.foundation.attach_adapters([chunk.language_model for chunk in chunks])
