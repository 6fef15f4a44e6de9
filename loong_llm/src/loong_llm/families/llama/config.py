"""Config of the Llama-style foundation (light: no torch import)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from loong_core.config.schema import ModelConfig


@dataclass
class LlamaConfig(ModelConfig):
    """Llama-style decoder-only transformer (Megatron argument names).

    Attributes:
        num_layers: Transformer layers.
        hidden_size: Model width.
        num_attention_heads: Query heads.
        num_query_groups: Key/value heads (grouped-query attention); None means one per head.
        ffn_hidden_size: SwiGLU inner width; None means ``8/3 * hidden`` rounded up to 64.
        vocab_size: Tokenizer vocabulary; None takes it from the dataset.
        make_vocab_size_divisible_by: Pad the embedding rows to a multiple of this (x TP).
        max_position_embeddings: Longest sequence.
        rotary_base: RoPE base frequency.
        norm_epsilon: RMSNorm epsilon.
        init_method_std: Std of the normal initialisation.
        hidden_dropout: Dropout after attention / MLP.
        attention_dropout: Dropout on attention probabilities.
        untie_embeddings_and_output_weights: Separate output projection (Llama 2/3 8B+).
    """

    num_layers: int = 4
    hidden_size: int = 256
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None
    ffn_hidden_size: Optional[int] = None
    vocab_size: Optional[int] = None
    make_vocab_size_divisible_by: int = 128
    max_position_embeddings: int = 2048
    rotary_base: float = 10000.0
    norm_epsilon: float = 1.0e-5
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    untie_embeddings_and_output_weights: bool = False

    def resolved_ffn_hidden_size(self) -> int:
        """The SwiGLU width actually used."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        return ((8 * self.hidden_size // 3) + 63) // 64 * 64

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        """Embedding rows: ``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by``
        and of the TP size, so that checkpoints keep their shapes when TP changes (TP <= 128)."""
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is unknown: set it or use a dataset that provides it")
        multiple = math.lcm(self.make_vocab_size_divisible_by, tensor_parallel)
        return (self.vocab_size + multiple - 1) // multiple * multiple
