"""MLA's core attention with DeepSeek sparse attention (DSA): the lightning indexer picks the
``topk`` keys of each query, attention runs over those only, and the indexer learns from a KL
loss against the main attention's distribution.

Stages (DeepSeek-V3.2, section 2.1), chosen by config:

- dense warm-up (``dsa_indexer_dense_warmup=true``): the main attention stays dense (causal) and
  the indexer is fitted to its head-summed distribution over every earlier key;
- sparse training: attention over the selected keys; the indexer's loss is over all earlier keys
  (``dsa_indexer_use_sparse_loss=false``) or over the selected ones only (``true``).

The indexer reads detached copies of the hidden states and the compressed query, so its loss
trains only the indexer, and the loss's own gradient reaches nothing else (megatron-core's
aux-loss scaler carries it, scaled as its MoE losses are). ``last_loss`` keeps the unscaled KL
of the latest forward for the metrics.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

from loong_llm.families.deepseek_v32.indexer import LightningIndexer
from loong_llm.families.deepseek_v32.sparse_attention import head_summed_probs, sparse_attention


class DSACoreAttention(MegatronModule):
    """Drop-in ``core_attention`` of megatron-core's MLA (which hands it the layer input ``x``
    and the compressed query ``qr`` when ``experimental_attention_variant='dsa'``).

    Args:
        config: megatron-core TransformerConfig (MLA).
        layer_number: 1-based layer number.
        softmax_scale: The main attention's scale (MLA's, YaRN mscale included).
        indexer_n_heads, indexer_head_dim, topk, loss_coeff, sparse_loss, dense_warmup: the
            ``dsa_*`` fields of :class:`~loong_llm.families.deepseek_v32.config.DeepSeekV32Config`.
        inv_freq: RoPE inverse frequencies of the indexer (``qk_pos_emb_head_dim`` channels).
        rope_scale: Scale of the indexer's cos and sin (YaRN's attention factor; 1 without).
        pg_collection: Process groups (TP for the head-summed target and sequence parallelism).
    """

    def __init__(self, config, layer_number: int, softmax_scale: float | None = None, *,
                 indexer_n_heads: int, indexer_head_dim: int, topk: int, loss_coeff: float,
                 sparse_loss: bool, dense_warmup: bool, inv_freq: torch.Tensor,
                 rope_scale: float = 1.0, pg_collection=None, **_unused):
        super().__init__(config=config)
        self.layer_number = layer_number
        self.softmax_scale = softmax_scale or (config.qk_head_dim + config.qk_pos_emb_head_dim) ** -0.5
        self.topk, self.loss_coeff = topk, loss_coeff
        self.sparse_loss, self.dense_warmup = sparse_loss, dense_warmup
        self.tp_group = getattr(pg_collection, "tp", None)
        self.indexer = LightningIndexer(config.hidden_size, config.q_lora_rank, indexer_n_heads,
                                        indexer_head_dim, config.qk_pos_emb_head_dim, inv_freq,
                                        config.init_method_std, rope_scale)
        self.last_loss: torch.Tensor | None = None

    def _full_sequence(self, t: torch.Tensor) -> torch.Tensor:
        if self.config.sequence_parallel and self.tp_group is not None and self.tp_group.size() > 1:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            return gather_from_sequence_parallel_region(t, group=self.tp_group)
        return t

    def forward(self, query, key, value, attention_mask=None, x=None, qr=None,
                attn_mask_type=None, packed_seq_params=None, **_unused):
        """``[s, b, h * dv]`` from ``query/key [s, b, h, dq]``, ``value [s, b, h, dv]``.

        ``attention_mask`` is None (causal) or a
        :class:`~loong_core.kernels.segment_mask.SegmentMask` of packed documents: each document
        is then attended alone (its own top-k, its own indexer loss terms), as if it were a
        sequence of its own; a document shorter than ``topk`` attends densely.
        """
        if packed_seq_params is not None:
            raise NotImplementedError(
                "DeepSeek sparse attention takes [s, b] sequences (packed documents as segment "
                "ids), not megatron-core's THD packed_seq_params.")
        s, b = query.shape[:2]
        x = self._full_sequence(x.detach())
        qr = self._full_sequence(qr.detach())
        train = self.training and torch.is_grad_enabled()
        if attention_mask is None:
            out, kl_sum = self._attend(query, key, value, x, qr, train)
        else:
            rows, kl_sum = [], query.new_zeros((), dtype=torch.float32)
            for row, spans in enumerate(document_spans(attention_mask)):
                parts = []
                for a, e in spans:
                    r = slice(row, row + 1)
                    part, kl = self._attend(query[a:e, r], key[a:e, r], value[a:e, r],
                                            x[a:e, r], qr[a:e, r], train)
                    parts.append(part)
                    kl_sum = kl_sum + kl
                rows.append(torch.cat(parts, dim=0))
            out = torch.cat(rows, dim=1)
        out = out.reshape(s, b, -1)
        if train:
            loss = kl_sum / (s * b)  # mean over every query of the batch
            self.last_loss = loss.detach()
            if self.loss_coeff > 0:
                out = MoEAuxLossAutoScaler.apply(out, loss * self.loss_coeff)
        return out

    def _attend(self, query, key, value, x, qr, train: bool):
        """Sparse attention of one causal sequence (``[s, b, ...]``) and, when ``train``, the
        sum over its queries of the indexer's KL (else 0)."""
        s, b = query.shape[:2]
        q_idx, k_idx, w_idx = self.indexer.project(x, qr)
        everything = torch.arange(s, device=query.device).expand(b, s, s)
        indices = everything if self.dense_warmup else self.indexer.topk(q_idx, k_idx, w_idx, self.topk)
        out = sparse_attention(query, key, value, indices, self.softmax_scale)
        if not train:
            return out, query.new_zeros((), dtype=torch.float32)
        target_indices = indices if (self.sparse_loss and not self.dense_warmup) else everything
        return out, self._indexer_kl_sum(query, key, q_idx, k_idx, w_idx, target_indices)

    def _indexer_kl_sum(self, query, key, q_idx, k_idx, w_idx, indices) -> torch.Tensor:
        """Sum over queries of KL(main attention over ``indices``, summed over all heads and
        renormalised || softmax of the indexer's scores over ``indices``)."""
        target = head_summed_probs(query.detach(), key.detach(), indices, self.softmax_scale)
        if self.tp_group is not None and self.tp_group.size() > 1:  # heads are split over TP
            torch.distributed.all_reduce(target, group=self.tp_group)
        target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)
        valid = indices <= torch.arange(indices.shape[1], device=indices.device).view(1, -1, 1)
        scores = self.indexer.selected_scores(q_idx, k_idx, w_idx, indices)
        log_q = torch.log_softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
        kl = torch.where(target > 0, target * (target.clamp_min(1e-30).log() - log_q),
                         torch.zeros_like(target))
        return kl.sum()


def document_spans(attention_mask) -> list[list[tuple[int, int]]]:
    """``[(start, end), ...]`` of the documents of each row of a segment mask ``[b, s]``
    (runs of equal ids; the padding after the last document is a run too)."""
    ids = attention_mask.segment_ids() if hasattr(attention_mask, "segment_ids") else attention_mask
    if ids.dim() != 2:
        raise ValueError(
            f"DeepSeek sparse attention reads packed documents as segment ids [b, s]; got an "
            f"attention mask of shape {tuple(ids.shape)}.")
    ids = ids.cpu()
    spans = []
    for row in ids:
        starts = [0, *(torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist(), row.numel()]
        spans.append(list(zip(starts[:-1], starts[1:])))
    return spans
