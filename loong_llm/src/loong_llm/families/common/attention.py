"""A core-attention module for megatron-core's local spec whose keys and values may have different
head widths (multi-latent attention). megatron-core's own local ``DotProductAttention`` does not
take ``k_channels`` / ``v_channels``; its MLA spec otherwise needs TransformerEngine."""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule


class LocalSDPAttention(MegatronModule):
    """Causal (or masked) softmax attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Takes megatron-core's core-attention arguments: query ``[sq, b, n, dk]``, key ``[sk, b, n, dk]``,
    value ``[sk, b, n, dv]``, ``attention_mask`` ``[b, 1, sq, sk]`` (True = masked) or None for
    causal; returns ``[sq, b, n * dv]``.
    """

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self",
                 attention_dropout=None, softmax_scale=None, k_channels=None, v_channels=None,
                 cp_comm_type=None, pg_collection=None, **kwargs):
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise NotImplementedError("LocalSDPAttention does not support context parallelism.")
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("LocalSDPAttention: packed sequences / attention bias.")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, n, s, d]
        mask = None if attention_mask is None else ~attention_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale)
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)
