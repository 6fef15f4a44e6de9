"""A composed VLM whose architecture and weights can come from a Hugging Face directory
(``model.init_from_hf``) through the checkpoint adapter named ``hf_family``."""

from __future__ import annotations

from typing import Any

from loong_core.errors import ConfigError
from loong_vlm.provider import VLMProvider


class HFVLMProvider(VLMProvider):
    """:class:`~loong_vlm.provider.VLMProvider` that reads ``model.init_from_hf``: the adapter
    ``hf_family`` sets the encoder's, projector's and foundation's fields from config.json when
    the provider is made, and loads every weight (vision tower included) into this rank's chunks.

    Attributes:
        hf_family: The registered checkpoint adapter of ``model.init_from_hf``.
    """

    hf_family = ""

    def __init__(self, config):
        if getattr(config, "init_from_hf", None):
            self.adapter().apply_hf_config(config, config.init_from_hf)
        self.check_config(config)
        super().__init__(config)

    def check_config(self, config) -> None:
        """Family rules on the (HF-updated) config, before anything is built; none by default."""

    def adapter(self):
        """The checkpoint adapter of this family."""
        from loong_llm.hf.registry import get_adapter

        return get_adapter(self.hf_family)

    def initialize_weights(self, chunks: list[Any]) -> None:
        """Load ``model.init_from_hf`` (vision tower and decoder) into this rank's chunks."""
        if not self.config.init_from_hf:
            super().initialize_weights(chunks)
            return
        from megatron.core import parallel_state as ps

        from loong_llm.hf.load import load_hf_into_chunks

        if ps.get_pipeline_model_parallel_world_size() > 1:
            raise ConfigError(f"loading a {self.hf_family} HF checkpoint supports pipeline_model_parallel_size=1 "
                              "only (convert at PP1; loong checkpoints reshard to other layouts).")
        encoder_tp = getattr(self.config.encoder, "tensor_model_parallel_size", None)
        if encoder_tp not in (None, ps.get_tensor_model_parallel_world_size()):
            raise ConfigError(
                f"loading a {self.hf_family} HF checkpoint with model.encoder.tensor_model_parallel_size={encoder_tp} "
                f"(the foundation's is {ps.get_tensor_model_parallel_world_size()}) is not supported; convert "
                "with `loong convert hf-to-loong` at the uniform layout and start from it with "
                "trainer.init_from (loong checkpoints load into any encoder layout).")
        load_hf_into_chunks(self.adapter(), self.config, chunks, self.config.init_from_hf)

    def hf_parts(self, chunks: list[Any]):
        """The :class:`~loong_llm.hf.load.HFParts` of ``model.init_from_hf`` (streaming converter)."""
        from loong_llm.hf.load import HFParts

        return HFParts(self.adapter(), self.config, chunks, self.config.init_from_hf)

    def attach_adapters(self, chunks: list[Any]) -> None:
        """LoRA is not wired into the VLM yet (``loong convert`` asks every model)."""
        if self.config.lora is not None and self.config.lora.enabled:
            raise ConfigError(f"model.foundation.lora is not supported by {self.hf_family} yet; set lora.rank=0.")
