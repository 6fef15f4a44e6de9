"""megatron-core's ``GPTModel`` with its loss from the kernel seam.

- ``kernels.cross_entropy`` not plain: the per-token loss over the (vocab-parallel) logits is
  ``kernels.get("cross_entropy")``.
- ``kernels.linear_cross_entropy`` not plain: with labels, the output layer and the loss are
  one op, ``kernels.get("linear_cross_entropy")(hidden, output_weight, labels)``, so the
  ``[tokens, vocab]`` logits are never held whole (the backend chunks them). Tied embeddings
  pass the shared embedding weight; under tensor parallelism the hidden states enter the
  tensor-parallel region as megatron-core's ``ColumnParallelLinear`` does (all-gathered along
  the sequence with sequence parallelism), so gradients match the plain path.

Multi-token prediction (``config.mtp_num_layers``) runs megatron-core's MTP block, then the
loss of each depth through the same seam (fused or not), masked by the micro batch's
``loss_mask`` shifted with the labels and, for packed documents (a :class:`SegmentMask`), at
every position whose shifted token lies in another document; each depth's loss enters the
gradient through megatron-core's ``MTPLossAutoScaler`` (weight ``mtp_loss_scaling_factor`` /
depth) and is kept in :attr:`SeamGPTModel.mtp_last_loss` for the ``mtp_loss`` metric. Without
labels only the main logits are returned (generation, evaluation). Inference with an
``inference_context`` keeps megatron-core's own post-processing.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel

from loong_core import kernels
from loong_core.engines.megatron.seam import chunked_attention, linear


def _tp_group(model):
    group = model.pg_collection.tp
    return group if group.size() > 1 else None


class SeamGPTModel(GPTModel):
    """A ``GPTModel`` (same constructor, state dict and outputs) whose loss is the seam's and
    whose parallel linear layers are the seam's (:func:`.linear.adopt`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        linear.adopt(self)
        #: ``[sum, count]`` of the last training forward's MTP loss (all depths), or None.
        self.mtp_last_loss = None

    def compute_language_model_loss(self, labels, logits):
        if kernels.is_plain("cross_entropy"):
            return super().compute_language_model_loss(labels, logits)
        loss = kernels.get("cross_entropy")(logits, labels.transpose(0, 1).contiguous(),
                                            group=_tp_group(self))
        return loss.transpose(0, 1).contiguous()

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, **kwargs):
        if (chunked_attention.active() is not None and torch.is_grad_enabled()
                and self.config.recompute_granularity == "full" and labels is not None):
            # A chunk of parallel.sequence_chunks under full recompute: the logits and the loss
            # are recomputed in the chunk's backward, so they exist for one chunk at a time.
            def post(hidden):
                return self._seam_postprocess(hidden, input_ids, position_ids, labels, **kwargs)

            # Reentrant, as megatron-core's layer recompute: the forward re-runs on the real
            # parameters (a saved-tensor checkpoint would hand the backward detached copies).
            return tensor_parallel.checkpoint(post, False, hidden_states)
        return self._seam_postprocess(hidden_states, input_ids, position_ids, labels, **kwargs)

    def _seam_postprocess(self, hidden_states, input_ids, position_ids, labels, **kwargs):
        if self.config.mtp_num_layers is not None and kwargs.get("inference_context") is None:
            return self._mtp_postprocess(hidden_states, input_ids, position_ids, labels, **kwargs)
        fused = (labels is not None and self.post_process and not kwargs.get("mtp_in_postprocess")
                 and self.config.mtp_num_layers is None
                 and kwargs.get("inference_context") is None
                 and not kernels.is_plain("linear_cross_entropy"))
        if not fused:
            return super()._postprocess(hidden_states, input_ids, position_ids, labels, **kwargs)
        return self.linear_cross_entropy(hidden_states, labels)

    def _token_loss(self, hidden_states, labels, runtime_gather_output=None):
        """Per-token loss ``[b, s]`` of final hidden states through the seam (fused or not)."""
        if not kernels.is_plain("linear_cross_entropy"):
            return self.linear_cross_entropy(hidden_states, labels)
        weight = self.output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(hidden_states, weight=weight,
                                      runtime_gather_output=runtime_gather_output)
        return self.compute_language_model_loss(labels, logits)

    def _mtp_postprocess(self, hidden_states, input_ids, position_ids, labels, **kwargs):
        """The MTP block, then the main loss with each depth's loss in its gradient (see the
        module docstring); main logits ``[b, s, v]`` without labels."""
        from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, roll_tensor

        from loong_core.kernels.segment_mask import SegmentMask

        attention_mask = kwargs.get("attention_mask")
        if kwargs.get("mtp_in_postprocess"):
            extra = kwargs.get("extra_block_kwargs") or {}
            hidden_states = self.mtp(
                input_ids=input_ids, position_ids=position_ids, hidden_states=hidden_states,
                attention_mask=attention_mask, rotary_pos_emb=kwargs.get("rotary_pos_emb"),
                rotary_pos_cos=kwargs.get("rotary_pos_cos"), rotary_pos_sin=kwargs.get("rotary_pos_sin"),
                packed_seq_params=kwargs.get("packed_seq_params"),
                sequence_len_offset=kwargs.get("sequence_len_offset"), embedding=self.embedding, **extra)
        if not self.post_process:
            return hidden_states
        depth = self.config.mtp_num_layers
        main, *mtp_hidden = torch.chunk(hidden_states, 1 + depth, dim=0)
        gather = kwargs.get("runtime_gather_output")
        if labels is None:
            weight = self.output_weight() if self.share_embeddings_and_output_weights else None
            logits, _ = self.output_layer(main, weight=weight, runtime_gather_output=gather)
            return logits.transpose(0, 1).contiguous()
        mask = kwargs.get("loss_mask")
        mask = torch.ones_like(labels, dtype=torch.float) if mask is None else mask.float()
        segments = attention_mask.segment_ids() if isinstance(attention_mask, SegmentMask) else None
        shifted_labels, shifted_segments = labels, segments
        cp = self.pg_collection.cp
        scale = self.config.mtp_loss_scaling_factor / depth
        total, count = main.new_zeros((), dtype=torch.float), main.new_zeros((), dtype=torch.float)
        for hidden in mtp_hidden:
            shifted_labels, _ = roll_tensor(shifted_labels, shifts=-1, dims=-1, cp_group=cp)
            mask, _ = roll_tensor(mask, shifts=-1, dims=-1, cp_group=cp)
            if segments is not None:  # the shifted token of another document predicts nothing
                shifted_segments, _ = roll_tensor(shifted_segments, shifts=-1, dims=-1,
                                                  cp_group=cp)
                mask = mask * (shifted_segments == segments)
            loss = self._token_loss(hidden, shifted_labels, gather).float() * mask
            total, count = total + loss.detach().sum(), count + mask.sum()
            if not self.config.calculate_per_token_loss:
                loss = loss / mask.sum().clamp_min(1)
            main = MTPLossAutoScaler.apply(main, scale * loss)
        if self.training:
            self.mtp_last_loss = torch.stack([total, count])
        return self._token_loss(main, labels, gather)

    def output_weight(self):
        """The output layer's weight shard ``[V_local, H]`` (the embedding's when tied)."""
        if self.share_embeddings_and_output_weights:
            return self.shared_embedding_or_output_weight()
        return self.output_layer.weight

    def linear_cross_entropy(self, hidden_states, labels):
        """Per-token loss ``[b, s]`` from the final hidden states ``[s(/tp), b, h]``."""
        group = _tp_group(self)
        if group is not None:
            if self.config.sequence_parallel:
                hidden_states = tensor_parallel.gather_from_sequence_parallel_region(
                    hidden_states, tensor_parallel_output_grad=True, group=group)
            else:
                hidden_states = tensor_parallel.copy_to_tensor_model_parallel_region(
                    hidden_states, group=group)
        s, b, h = hidden_states.shape
        flat_labels = labels.transpose(0, 1).reshape(-1)
        loss = kernels.get("linear_cross_entropy")(hidden_states.reshape(s * b, h),
                                                   self.output_weight(), flat_labels, group=group)
        return loss.view(s, b).transpose(0, 1).contiguous()
