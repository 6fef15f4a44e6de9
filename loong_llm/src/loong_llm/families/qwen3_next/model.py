"""The Qwen3-Next family: megatron-core's MoE block spec with Gated DeltaNet in the linear-attention
layers, gated full attention in the others and zero-centred RMSNorms everywhere; the hybrid-stack
part (:class:`HybridStackProvider`) is shared with Qwen3.5."""

from __future__ import annotations

import dataclasses
from typing import Any

from loong_llm.families.common.moe import MoEProvider
from loong_llm.families.qwen3_next.config import Qwen3NextConfig


def _zero_center_norms(node, norm_cls, seen: set) -> None:
    """Replace every norm class of a spec tree (megatron-core's RMSNorm choices) by ``norm_cls``."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from loong_core.engines.megatron.seam.modules import SeamRMSNorm

    norms = (WrappedTorchNorm, SeamRMSNorm)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, ModuleSpec):
        if node.module in norms:
            node.module = norm_cls
        if node.submodules is not None:
            _zero_center_norms(node.submodules, norm_cls, seen)
    elif isinstance(node, (list, tuple)):
        for item in node:
            _zero_center_norms(item, norm_cls, seen)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, type) and value in norms:
                setattr(node, f.name, norm_cls)
            else:
                _zero_center_norms(value, norm_cls, seen)


class HybridStackProvider:
    """The Gated DeltaNet + gated attention stack, mixed into a decoder provider: per layer
    ``self_attention`` is :class:`GatedDeltaNet` or megatron-core's attention with
    ``attention_output_gate`` (q/k norms, partial RoPE); every norm zero-centred. The provider's
    :meth:`decoder_block_spec` gives the block spec it edits."""

    supports_context_parallel = False  # the linear-attention state does not cross CP ranks yet
    supports_sequence_chunks = False

    def family_transformer_kwargs(self) -> dict[str, Any]:
        c = self.config
        return {**super().family_transformer_kwargs(),
                "attention_output_gate": c.attention_output_gate,
                # megatron-core's field: checkpoints then keep each layer apart (the layers differ)
                "linear_attention_freq": c.linear_layers(),
                "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
                "linear_key_head_dim": c.linear_key_head_dim,
                "linear_value_head_dim": c.linear_value_head_dim,
                "linear_num_key_heads": c.linear_num_key_heads,
                "linear_num_value_heads": c.linear_num_value_heads}

    def decoder_block_spec(self, config, vp_stage):
        """This stage's block spec before the hybrid edits (the base provider's)."""
        return super().layer_spec(config, vp_stage)

    def layer_spec(self, config, vp_stage):
        """The block spec with zero-centred norms and this stage's linear-attention layers."""
        from megatron.core.transformer.spec_utils import ModuleSpec
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        from loong_llm.families.qwen3_next.gated_delta_net import GatedDeltaNet
        from loong_llm.families.qwen3_next.zero_centered_norm import ZeroCenteredRMSNorm

        block = self.decoder_block_spec(config, vp_stage)
        _zero_center_norms(block, ZeroCenteredRMSNorm, set())  # the block's final norm too
        offset = get_transformer_layer_offset(config, vp_stage)
        pattern = self.config.linear_layers()
        for j, layer in enumerate(block.layer_specs):  # the layers may share one spec object
            if pattern[offset + j]:
                block.layer_specs[j] = dataclasses.replace(layer, submodules=dataclasses.replace(
                    layer.submodules, self_attention=ModuleSpec(module=GatedDeltaNet)))
        return block

    def attention_params_per_layer(self) -> float:
        """Mean over the layers of full attention (q with its gate, k, v, o) and Gated DeltaNet
        (the input projections and ``out_proj``)."""
        c = self.config
        q = c.num_attention_heads * c.head_dim()
        kv = (c.num_query_groups or c.num_attention_heads) * c.head_dim()
        full = c.hidden_size * (2 * q + 2 * kv) + q * c.hidden_size
        r = c.linear_num_value_heads // c.linear_num_key_heads
        qkvz = c.linear_num_key_heads * (2 * c.linear_key_head_dim + 2 * r * c.linear_value_head_dim)
        values = c.linear_num_value_heads * c.linear_value_head_dim
        linear = c.hidden_size * (qkvz + 2 * c.linear_num_value_heads) + values * c.hidden_size
        pattern = c.linear_layers()
        return (sum(pattern) * linear + (len(pattern) - sum(pattern)) * full) / len(pattern)

    def flops_per_token(self, seq_length: int) -> float:
        """6 x parameters + attention scores of the full-attention layers only; a Gated DeltaNet
        layer's recurrence costs about 3 state products of ``dk x dv`` per value head and token
        (``S^T k``, the rank-1 update, ``S^T q``), not a term in the sequence length."""
        c = self.config
        pattern = c.linear_layers()
        linear, full = sum(pattern), len(pattern) - sum(pattern)
        matmul_params = c.num_layers * (self.attention_params_per_layer() + self.mlp_params_per_layer())
        matmul_params += (c.vocab_size or 0) * c.hidden_size
        scores = 2 * full * seq_length * c.num_attention_heads * c.head_dim()
        recurrence = linear * 3 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
        return 6.0 * matmul_params + 6.0 * (scores + recurrence)


class Qwen3NextProvider(HybridStackProvider, MoEProvider):
    """Qwen3-Next on megatron-core: the hybrid stack with MoE MLPs whose ``shared_experts`` are
    gated by ``sigmoid(x . gate_weight)``."""

    family = "qwen3_next"
    config: Qwen3NextConfig

    def family_transformer_kwargs(self) -> dict[str, Any]:
        return {**super().family_transformer_kwargs(),
                "moe_shared_expert_gate": self.config.moe_shared_expert_gate}

    def mlp_params_per_layer(self) -> float:
        return super().mlp_params_per_layer() + self.config.hidden_size  # + the shared expert gate
