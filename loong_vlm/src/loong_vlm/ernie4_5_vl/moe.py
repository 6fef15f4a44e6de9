"""ERNIE-4.5-VL's modality-isolated MoE layer on megatron-core MoE layers.

Each MoE layer holds two megatron-core ``MoELayer`` s - ``text_moe`` and ``vision_moe``, each
with its own router, experts (the vision experts narrower) and token dispatcher, so expert,
tensor and sequence parallelism work in each as in any MoE family - and shared experts every
token passes through. Which tokens are vision tokens is a ``[s, b]`` mask the composer computes
from the token ids and hands to every layer before the decoder runs (:func:`set_vision_mask`),
already cut as the hidden states are: the context-parallel chunks of the rank, then its
sequence-parallel slice. The mask is not a tensor the layers pass on (megatron-core's
``TransformerLayer`` forwards no per-token side channel to its MLP but the MoE padding mask,
which means something else), so a layer reads it when it runs.

Every rank calls both MoE layers, possibly with no tokens, so the expert-parallel collectives of
each stay matched across ranks.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from megatron.core.transformer.moe.router import TopKRouter


class ErnieRouter(TopKRouter):
    """Softmax over the experts; the top-k of ``probability + expert_bias`` are picked and their
    probabilities (without the bias) renormalised (transformers' ``Ernie4_5_VLMoeMoeTopKRouter``).
    The load-balancing loss is megatron-core's."""

    norm_min = 1e-12  # HF moe_norm_min

    def __init__(self, config, pg_collection=None):
        super().__init__(config=config, pg_collection=pg_collection)
        # ERNIE's expert-score bias (HF ``e_score_correction_bias``), kept as a fixed statistic:
        # megatron-core's own expert bias is for sigmoid routers only.
        del self.expert_bias
        self.register_buffer("expert_bias", torch.zeros(config.num_moe_experts, dtype=torch.float32,
                                                        device=self.weight.device))

    def routing(self, logits: torch.Tensor, padding_mask: Optional[torch.Tensor] = None):
        seq_length, bsz = logits.shape[:2]
        logits = logits.view(-1, self.config.num_moe_experts)
        probs_all = torch.softmax(logits.float(), dim=-1)
        select = probs_all + self.expert_bias.to(probs_all.device)
        _, top = torch.topk(select, self.topk, dim=-1)
        picked = probs_all.gather(1, top)
        picked = picked / picked.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
        probs = torch.zeros_like(probs_all).scatter(1, top, picked).type_as(logits)
        routing_map = torch.zeros_like(logits, dtype=torch.int).scatter(1, top, 1).bool()
        if self.training and torch.is_grad_enabled() and self.is_aux_loss_enabled():
            from megatron.core.transformer.moe.moe_utils import compute_routing_scores_for_aux_loss

            aux_map, aux_scores = compute_routing_scores_for_aux_loss(logits, self.topk, self.score_function)
            probs = self._apply_aux_loss(probs, aux_scores, aux_map, with_padding_mask=False)
            probs = self._apply_seq_aux_loss(probs, aux_scores, aux_map, seq_length, bsz, with_padding_mask=False)
        return probs, routing_map


class ModalityMoELayer(MegatronModule):
    """Text experts for text tokens, vision experts for vision tokens, shared experts for all.

    Args:
        config: The decoder's ``TransformerConfig`` (``moe_ffn_hidden_size``: text experts).
        submodules: megatron-core's ``MoESubmodules`` (experts, shared experts).
        layer_number: The layer's number.
        pg_collection: Process groups (megatron-core's default when None).

    The vision experts' width is ``config.vision_moe_ffn_hidden_size`` (set by the foundation).
    """

    def __init__(self, config, submodules: MoESubmodules, layer_number: Optional[int] = None,
                 pg_collection=None):
        super().__init__(config=config)
        if pg_collection is None:
            from megatron.core.transformer.moe.moe_layer import get_default_pg_collection

            pg_collection = get_default_pg_collection()
        routed = MoESubmodules(experts=submodules.experts, shared_experts=None, router=ErnieRouter)
        text = copy.copy(config)
        text.moe_shared_expert_intermediate_size = None
        vision = copy.copy(text)
        vision.moe_ffn_hidden_size = config.vision_moe_ffn_hidden_size
        self.text_moe = MoELayer(text, routed, layer_number, pg_collection)
        self.vision_moe = MoELayer(vision, routed, layer_number, pg_collection)
        self.shared_experts = None
        if config.moe_shared_expert_intermediate_size:
            from megatron.core.transformer.spec_utils import build_module

            self.shared_experts = build_module(submodules.shared_experts, config=config,
                                               pg_collection=pg_collection, gate=False)
        self.vision_mask: Optional[torch.Tensor] = None  # [s, b] bool, set per forward

    def forward(self, hidden_states: torch.Tensor, padding_mask: Optional[torch.Tensor] = None, **kwargs):
        """``[s, b, h]`` -> ``(output, None)`` like megatron-core's MLPs."""
        s, b, h = hidden_states.shape
        flat = hidden_states.reshape(s * b, 1, h)
        mask = self.vision_mask
        if mask is None:
            vision_rows = torch.zeros(0, dtype=torch.long, device=flat.device)
            text_rows = torch.arange(s * b, device=flat.device)
        else:
            if tuple(mask.shape) != (s, b):
                raise ValueError(f"the vision-token mask is {tuple(mask.shape)}, the layer's tokens {(s, b)}: "
                                 "set it with loong_vlm.ernie4_5_vl.moe.set_vision_mask for this micro batch.")
            mask = mask.reshape(-1).to(flat.device)
            vision_rows, text_rows = mask.nonzero().squeeze(-1), (~mask).nonzero().squeeze(-1)
        out = torch.zeros_like(flat)
        for moe, rows in ((self.text_moe, text_rows), (self.vision_moe, vision_rows)):
            routed, _ = moe(flat[rows])
            out = out.index_copy(0, rows, routed)
        out = out.reshape(s, b, h)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return out, None


def modality_layers(module) -> list[ModalityMoELayer]:
    """The modality-isolated MoE layers inside ``module``."""
    return [m for m in module.modules() if isinstance(m, ModalityMoELayer)]


def set_vision_mask(layers: list[ModalityMoELayer], mask: Optional[torch.Tensor]) -> None:
    """Give every layer the ``[s, b]`` vision-token mask of the micro batch about to run (this
    rank's tokens), or None (all text)."""
    for layer in layers:
        layer.vision_mask = mask
