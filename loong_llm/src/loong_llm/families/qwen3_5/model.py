"""The Qwen3.5 dense text family: Qwen3-Next's hybrid stack over dense megatron-core layers."""

from __future__ import annotations

from loong_llm.families.common.provider import DecoderProvider
from loong_llm.families.qwen3_5.config import Qwen3_5Config
from loong_llm.families.qwen3_next.model import HybridStackProvider


class Qwen3_5Provider(HybridStackProvider, DecoderProvider):
    """Qwen3.5 on megatron-core: per layer Gated DeltaNet or gated attention, a dense MLP."""

    family = "qwen3_5"
    config: Qwen3_5Config

    def decoder_block_spec(self, config, vp_stage):
        """The dense layer spec, one per layer of this stage, with the block's final norm."""
        from megatron.core.transformer.transformer_block import (
            TransformerBlockSubmodules,
            get_num_layers_to_build,
        )

        layer = DecoderProvider.layer_spec(self, config, vp_stage)
        count = get_num_layers_to_build(config, vp_stage=vp_stage)
        return TransformerBlockSubmodules(layer_specs=[layer] * count,
                                          layer_norm=layer.submodules.input_layernorm)
