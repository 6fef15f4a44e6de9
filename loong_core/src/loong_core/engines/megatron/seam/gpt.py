"""megatron-core's ``GPTModel`` with its loss from the kernel seam.

- ``kernels.cross_entropy`` not plain: the per-token loss over the (vocab-parallel) logits is
  ``kernels.get("cross_entropy")``.
- ``kernels.linear_cross_entropy`` not plain: with labels, the output layer and the loss are
  one op, ``kernels.get("linear_cross_entropy")(hidden, output_weight, labels)``, so the
  ``[tokens, vocab]`` logits are never held whole (the backend chunks them). Tied embeddings
  pass the shared embedding weight; under tensor parallelism the hidden states enter the
  tensor-parallel region as megatron-core's ``ColumnParallelLinear`` does (all-gathered along
  the sequence with sequence parallelism), so gradients match the plain path.

Multi-token prediction and inference keep megatron-core's own post-processing.
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
        fused = (labels is not None and self.post_process and not kwargs.get("mtp_in_postprocess")
                 and self.config.mtp_num_layers is None
                 and kwargs.get("inference_context") is None
                 and not kernels.is_plain("linear_cross_entropy"))
        if not fused:
            return super()._postprocess(hidden_states, input_ids, position_ids, labels, **kwargs)
        return self.linear_cross_entropy(hidden_states, labels)

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
