"""The Llama-style foundation as a megatron-core GPTModel with a local (no TransformerEngine) spec."""

from __future__ import annotations

import torch

from loong_core.engines.model_provider import ModelProvider
from loong_llm.families.llama.config import LlamaConfig


def layer_spec():
    """megatron-core layer spec: RMSNorm (from the config), SwiGLU MLP, RoPE attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(normalization="RMSNorm")


class LlamaProvider(ModelProvider):
    """Builds and runs the Llama-style model on the megatron engine."""

    engines = ("megatron",)
    config: LlamaConfig

    def megatron_config(self, parallel_kwargs: dict):
        from megatron.core.transformer.transformer_config import TransformerConfig

        c = self.config
        return TransformerConfig(
            num_layers=c.num_layers,
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            num_query_groups=c.num_query_groups,
            ffn_hidden_size=c.resolved_ffn_hidden_size(),
            normalization="RMSNorm",
            layernorm_epsilon=c.norm_epsilon,
            gated_linear_unit=True,
            activation_func=torch.nn.functional.silu,
            add_bias_linear=False,
            add_qkv_bias=False,
            hidden_dropout=c.hidden_dropout,
            attention_dropout=c.attention_dropout,
            init_method_std=c.init_method_std,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            **parallel_kwargs,
        )

    def build_megatron_model(self, config, pre_process: bool, post_process: bool, vp_stage):
        from megatron.core.models.gpt import GPTModel

        c = self.config
        return GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(),
            vocab_size=c.padded_vocab_size(config.tensor_model_parallel_size),
            max_sequence_length=c.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=not c.untie_embeddings_and_output_weights,
            position_embedding_type="rope",
            rotary_base=c.rotary_base,
            vp_stage=vp_stage,
        )

    def forward_step(self, model, batch: dict):
        # attention_mask (optional, [b, 1, s, s], True = masked) keeps packed documents apart.
        output = model(batch["tokens"], batch["position_ids"], batch.get("attention_mask"),
                       labels=batch["labels"])
        loss_mask = batch["loss_mask"].float()

        def loss_func(per_token_loss):
            mask = loss_mask.reshape(-1)
            loss_sum = (per_token_loss.float().reshape(-1) * mask).sum()
            num_tokens = mask.sum().to(torch.int)
            return loss_sum, num_tokens, {"loss": torch.stack([loss_sum.detach(), mask.sum()])}

        return output, loss_func

    def flops_per_token(self, seq_length: int) -> float:
        """6 x parameters (matmuls) + attention scores, forward + backward (PaLM appendix B)."""
        c = self.config
        head_dim = c.hidden_size // c.num_attention_heads
        kv = (c.num_query_groups or c.num_attention_heads) * head_dim
        per_layer = (c.hidden_size * (c.hidden_size + 2 * kv) + c.hidden_size * c.hidden_size
                     + 3 * c.hidden_size * c.resolved_ffn_hidden_size())
        vocab = c.vocab_size or 0
        matmul_params = c.num_layers * per_layer + vocab * c.hidden_size
        attention = 2 * c.num_layers * seq_length * c.hidden_size  # QK^T and AV, per token
        return 6.0 * matmul_params + 6.0 * attention
