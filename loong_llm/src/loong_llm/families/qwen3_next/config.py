"""Config of the Qwen3-Next family and the hybrid-stack fields it shares with Qwen3.5 (light: no
torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from loong_core.config.rules import positive
from loong_core.errors import ConfigError
from loong_llm.families.common.config import MoEDecoderConfig


@dataclass
class HybridStackFields:
    """The Gated DeltaNet + gated attention stack of Qwen3-Next and Qwen3.5 (megatron-core's names
    where it has them); mixed into a decoder config.

    Attributes:
        linear_attention_freq: Which layers are linear attention: an int ``N`` (``N - 1`` Gated
            DeltaNet layers, then one full attention layer, repeated) or a 0/1 list per layer
            (1: linear attention).
        linear_conv_kernel_dim: Width of the causal depthwise convolution over q, k and v.
        linear_key_head_dim: Width of a Gated DeltaNet query/key head.
        linear_value_head_dim: Width of a Gated DeltaNet value head.
        linear_num_key_heads: Gated DeltaNet query/key heads.
        linear_num_value_heads: Gated DeltaNet value heads (a multiple of the key heads: each key
            head serves that many consecutive value heads).
        attention_output_gate: Full attention multiplies its output by ``sigmoid(gate)``, the gate
            projected with the queries (megatron-core's ``attention_output_gate``).
        layernorm_zero_centered_gamma: RMSNorms store ``weight - 1`` (``norm(x) * (1 + w)``).
    """

    linear_attention_freq: Union[int, list[int]] = 4
    linear_conv_kernel_dim: int = positive(4)
    linear_key_head_dim: int = positive(128)
    linear_value_head_dim: int = positive(128)
    linear_num_key_heads: int = positive(16)
    linear_num_value_heads: int = positive(32)
    attention_output_gate: bool = True
    layernorm_zero_centered_gamma: bool = True
    qk_layernorm: bool = True
    rotary_percent: float = 0.25
    norm_epsilon: float = 1.0e-6

    def linear_layers(self) -> list[int]:
        """1 for a Gated DeltaNet layer, 0 for a full attention layer, per layer."""
        freq = self.linear_attention_freq
        if isinstance(freq, int):
            return [0 if (i + 1) % freq == 0 else 1 for i in range(self.num_layers)]
        return [int(x) for x in freq]

    def check_hybrid_stack(self, run, path: str) -> None:
        """The pattern, the heads against TP; no CP, no sequence chunks, no MTP (with why)."""
        pattern = self.linear_layers()
        if len(pattern) != self.num_layers or set(pattern) - {0, 1}:
            raise ConfigError(
                f"'{path}.linear_attention_freq' = {self.linear_attention_freq} must be an int or a "
                f"0/1 list of {self.num_layers} entries (1: Gated DeltaNet, 0: full attention).")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"'{path}.linear_num_value_heads' = {self.linear_num_value_heads} must be a multiple "
                f"of {path}.linear_num_key_heads = {self.linear_num_key_heads}.")
        p = run.parallel
        tp = p.tensor_model_parallel_size
        if self.linear_num_key_heads % tp:
            raise ConfigError(
                f"'{path}.linear_num_key_heads' = {self.linear_num_key_heads} must be a multiple of "
                f"parallel.tensor_model_parallel_size = {tp} (each rank holds whole key-head groups).")
        why = ("the Gated DeltaNet layers' recurrent state would have to pass from one "
               "sequence piece to the next, which loong does not do yet")
        if p.context_parallel_size > 1:
            raise ConfigError(f"'parallel.context_parallel_size' = {p.context_parallel_size} with model "
                              f"'{self.name}': {why}; set parallel.context_parallel_size=1.")
        if p.sequence_chunks > 1:
            raise ConfigError(f"'parallel.sequence_chunks' = {p.sequence_chunks} with model "
                              f"'{self.name}': {why}; set parallel.sequence_chunks=1.")
        if self.mtp_num_layers:
            raise ConfigError(f"'{path}.mtp_num_layers' with model '{self.name}': the MTP layers of "
                              f"Qwen3-Next / Qwen3.5 are not supported yet; set {path}.mtp_num_layers=null.")


@dataclass
class Qwen3NextConfig(HybridStackFields, MoEDecoderConfig):
    """Qwen3-Next: the hybrid stack (:class:`HybridStackFields`), every layer with an MoE MLP
    (softmax top-k router, renormalised, and a shared expert scaled by ``sigmoid(x . w)``).

    Attributes:
        moe_shared_expert_gate: The shared expert's output is scaled by ``sigmoid(x . w)``.
    Further fields: :class:`HybridStackFields`,
    :class:`~loong_llm.families.common.config.MoEDecoderConfig`.
    """

    moe_shared_expert_gate: bool = True

    def check(self, run, path: str) -> None:
        """MoE rules plus the hybrid stack's."""
        super().check(run, path)
        self.check_hybrid_stack(run, path)
