"""DeepStack: visual features of intermediate encoder layers added to the hidden states of the
first decoder layers at the visual token positions.

Deepstack feature ``k`` is added to the output of decoder layer ``k`` (0-based, global), as in
transformers' ``Qwen3VLTextModel``. The additions are dense ``[s, b, h]`` tensors (zero at text
tokens) added by forward hooks on megatron-core's transformer layers; under sequence parallelism
they are scattered over the sequence like the decoder input.

Gradients: inside the layers the additions use detached tensors (so activation recomputation,
which re-runs the layers during backward, never reaches into the encoder's graph); their
gradients are collected there and handed to the real additions by a bridge on the decoder input,
whose backward runs after every decoder layer's.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel

from loong_core.errors import ConfigError


def dense_addends(tokens: torch.Tensor, placed: list[tuple[int, list[torch.Tensor]]], hidden_size: int,
                  dtype: torch.dtype) -> list[torch.Tensor]:
    """One ``[s, b, h]`` tensor per deepstack layer: the features at their placeholders, else 0.

    Args:
        tokens: ``[b, s]`` token ids.
        placed: ``(placeholder id, [feature [n, h] per deepstack layer])`` per visual input kind,
            features in reading order.
        hidden_size: Width of the decoder.
        dtype: Dtype of the decoder's hidden states.
    """
    layers = max((len(features) for _, features in placed), default=0)
    addends = []
    for k in range(layers):
        addend = torch.zeros(*tokens.shape, hidden_size, dtype=dtype, device=tokens.device)
        for token_id, features in placed:
            addend = addend.masked_scatter((tokens == token_id).unsqueeze(-1), features[k].to(dtype))
        addends.append(addend.transpose(0, 1).contiguous())
    return addends


class _GradientSlots:
    """Gradients of the detached additions, collected during the decoder's backward."""

    def __init__(self, count: int):
        self.grads: list[torch.Tensor | None] = [None] * count


class _AddDetached(torch.autograd.Function):
    """``hidden + addend`` whose gradient for ``addend`` goes to ``slots.grads[k]``."""

    @staticmethod
    def forward(ctx, hidden, addend, slots, k):
        ctx.slots, ctx.k = slots, k
        return hidden + addend

    @staticmethod
    def backward(ctx, grad):
        previous = ctx.slots.grads[ctx.k]
        ctx.slots.grads[ctx.k] = grad if previous is None else previous + grad
        return grad, None, None, None


class _Bridge(torch.autograd.Function):
    """Identity on the decoder input whose backward gives the additions their collected gradients."""

    @staticmethod
    def forward(ctx, decoder_input, slots, *addends):
        ctx.slots = slots
        ctx.like = [torch.zeros((), dtype=a.dtype, device=a.device).expand(a.shape) for a in addends]
        return decoder_input.view_as(decoder_input)

    @staticmethod
    def backward(ctx, grad):
        grads = [g if g is not None else like for g, like in zip(ctx.slots.grads, ctx.like)]
        ctx.slots.grads = [None] * len(grads)
        return (grad, None, *grads)


class DeepstackInjector:
    """Adds the current deepstack addends to the outputs of the first decoder layers.

    Args:
        decoder: The foundation's ``TransformerBlock`` on the first pipeline stage.
        num_layers: Deepstack features per visual input (the first ``num_layers`` decoder layers
            receive them).
        sequence_parallel: Whether the decoder's hidden states are split over the TP ranks.
    """

    def __init__(self, decoder, num_layers: int, sequence_parallel: bool):
        by_number = {layer.layer_number - 1: layer for layer in decoder.layers}
        missing = [k for k in range(num_layers) if k not in by_number]
        if missing:
            raise ConfigError(
                f"deepstack adds visual features to decoder layers 0..{num_layers - 1}, but layers "
                f"{missing} are not on the first pipeline stage; give the first stage at least "
                f"{num_layers} layers (parallel.pipeline_model_parallel_size / layout).")
        self.sequence_parallel = sequence_parallel
        self.addends: list[torch.Tensor] = []
        self.slots = _GradientSlots(0)
        self.handles = [by_number[k].register_forward_hook(self._hook(k)) for k in range(num_layers)]

    def set(self, decoder_input: torch.Tensor, addends: list[torch.Tensor]) -> torch.Tensor:
        """Arm the additions ``[s, b, h]`` (full sequence) of the next decoder forward (an empty
        list: no images) and return ``decoder_input`` bridged to their gradients."""
        if self.sequence_parallel:
            addends = [tensor_parallel.scatter_to_sequence_parallel_region(a) for a in addends]
        self.addends = [a.detach() for a in addends]
        self.slots = _GradientSlots(len(addends))
        if torch.is_grad_enabled() and any(a.requires_grad for a in addends):
            return _Bridge.apply(decoder_input, self.slots, *addends)
        return decoder_input

    def _hook(self, k: int):
        def add(module, args, output):
            if k >= len(self.addends):
                return output
            hidden, context = output
            return _AddDetached.apply(hidden, self.addends[k], self.slots, k), context

        return add
