"""The DeepSeek-V3.2 family: DeepSeek-V3's provider with DSA as MLA's core attention."""

from __future__ import annotations

from typing import Any

from loong_llm.families.deepseek_v3.model import DeepSeekV3Provider
from loong_llm.families.deepseek_v32.config import DeepSeekV32Config

INDEXER_METRIC = "dsa_indexer_loss"


class DeepSeekV32Provider(DeepSeekV3Provider):
    """MLA whose core attention is :class:`~.dsa_attention.DSACoreAttention` in every layer;
    the indexer's KL loss is reported per step as ``dsa_indexer_loss`` (mean over layers)."""

    family = "deepseek_v32"
    config: DeepSeekV32Config
    supports_context_parallel = False
    supports_sequence_chunks = False
    reported_metrics = (*DeepSeekV3Provider.reported_metrics, INDEXER_METRIC)

    def family_transformer_kwargs(self) -> dict[str, Any]:
        # megatron-core's MLA hands the core attention the layer input and compressed query
        return {**super().family_transformer_kwargs(), "experimental_attention_variant": "dsa"}

    def layer_spec(self, config, vp_stage):
        from megatron.core.transformer.spec_utils import ModuleSpec

        from loong_llm.families.common import rope
        from loong_llm.families.deepseek_v32.dsa_attention import DSACoreAttention

        c = self.config
        spec = super().layer_spec(config, vp_stage)
        params = dict(indexer_n_heads=c.dsa_indexer_n_heads, indexer_head_dim=c.dsa_indexer_head_dim,
                      topk=c.dsa_indexer_topk, loss_coeff=c.dsa_indexer_loss_coeff,
                      sparse_loss=c.dsa_indexer_use_sparse_loss,
                      dense_warmup=c.dsa_indexer_dense_warmup,
                      inv_freq=rope.inv_freq(c.qk_pos_emb_head_dim, c.rotary_base, c.rope_scaling),
                      rope_scale=rope.attention_factor(c.rope_scaling))
        for layer in spec.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = ModuleSpec(
                module=DSACoreAttention, params=params)
        return spec

    def step_metrics(self, model) -> dict:
        import torch

        from loong_llm.families.deepseek_v32.dsa_attention import DSACoreAttention

        metrics = super().step_metrics(model)
        losses = [m.last_loss for m in model.modules()
                  if isinstance(m, DSACoreAttention) and m.last_loss is not None]
        if losses:
            metrics[INDEXER_METRIC] = torch.stack([torch.stack(losses).sum(),
                                                   torch.tensor(float(len(losses)))])
            for m in model.modules():
                if isinstance(m, DSACoreAttention):
                    m.last_loss = None
        return metrics

    def attention_params_per_layer(self) -> float:
        c = self.config
        indexer = (c.q_lora_rank * c.dsa_indexer_n_heads * c.dsa_indexer_head_dim
                   + c.hidden_size * (c.dsa_indexer_head_dim + c.dsa_indexer_n_heads))
        return super().attention_params_per_layer() + indexer
