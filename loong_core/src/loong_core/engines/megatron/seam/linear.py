"""megatron-core's parallel linear layers with the weight gradient written into ``main_grad``.

megatron-core runs every ``ColumnParallelLinear`` / ``RowParallelLinear`` through
``LinearWithGradAccumulationAndAsyncCommunication``. Without ``gradient_accumulation_fusion``
(which needs Apex's or TransformerEngine's CUDA kernel) its backward returns the weight gradient
as a new tensor, autograd stores it in ``weight.grad`` and megatron-core's DDP hook adds it into
the fp32 gradient buffer (``weight.main_grad``): one more ``[out, in]`` tensor and one more pass
over it per layer. :class:`MainGradLinear` does on CPU what the fused kernel does on CUDA: the
backward accumulates ``grad_output^T @ input`` straight into ``main_grad`` (``addmm_``), sets
``weight.grad_added_to_main_grad`` and hands autograd an uninitialised stand-in, so the DDP hook
still runs (``overlap_grad_reduce`` counts the parameter ready) but adds nothing.

Numbers are bit-identical to megatron-core's: the first accumulation of a step lands on a
zeroed ``main_grad`` (``0 + G`` is ``G``; MKL's ``addmm_`` onto zeros equals its ``mm``, tested),
and later micro-batches (``main_grad`` no longer zero) compute the gradient first and add it,
in megatron-core's order. A weight with ``zero_out_wgrad`` (the embedding tied to the output
layer on one pipeline stage, which also receives the embedding's gradient) gets no stand-in on
the first accumulation (the embedding's gradient alone reaches the hook) and megatron-core's
plain gradient on later ones, so autograd sums the two in the same order as before.

:class:`SeamColumnParallelLinear` / :class:`SeamRowParallelLinear` are the same modules
(parameters, ``sharded_state_dict``, tensor-parallel sharding and checkpoints unchanged) whose
matmul takes this path when it applies (:func:`covers`) and megatron-core's function otherwise.
:func:`adopt` turns a built model's megatron-core linears into them (after construction: some
megatron-core modules check their spec's linear classes by identity, MLA among them).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.utils import prepare_input_tensors_for_wgrad_compute


def covers(weight: torch.Tensor, gradient_accumulation_fusion: bool, sequence_parallel: bool,
           grad_output_buffer) -> bool:
    """:class:`MainGradLinear` serves this call: a trained fp32 CPU weight under megatron-core's
    DDP (``main_grad`` of the same dtype), megatron-core's fused accumulation not requested,
    no sequence parallelism (its all-gather / reduce-scatter stay megatron-core's), no
    deferred embedding wgrad, and no gradient hook on the weight (``register_hook``: such a hook
    needs the real gradient, e.g. the VLM's sum of a sharded encoder's gradients over its
    replicas, which the stand-in gradient would not carry)."""
    return (weight.requires_grad and weight.device.type == "cpu" and weight.dtype == torch.float32
            and not gradient_accumulation_fusion and not sequence_parallel
            and grad_output_buffer is None and hasattr(weight, "grad_added_to_main_grad")
            and getattr(weight, "main_grad", None) is not None
            and weight.main_grad.dtype == weight.dtype
            and not getattr(weight, "_backward_hooks", None))


def accumulate_weight_grad(weight: torch.Tensor, grad_output: torch.Tensor, input: torch.Tensor):
    """Add ``grad_output^T @ input`` (both 2-D) to ``weight.main_grad``; return what autograd
    should receive as the weight's gradient (see the module docstring)."""
    tied = getattr(weight, "zero_out_wgrad", False)
    if not weight.grad_added_to_main_grad:  # main_grad is zero since zero_grad_buffer
        weight.main_grad.addmm_(grad_output.t(), input)
        weight.grad_added_to_main_grad = True
        return None if tied else torch.empty_like(weight)
    grad_weight = grad_output.t().matmul(input)
    if tied:  # autograd adds the embedding's gradient to it, the DDP hook adds the sum
        return grad_weight
    weight.main_grad.add_(grad_weight)
    return torch.empty_like(weight)


class MainGradLinear(torch.autograd.Function):
    """``input @ weight^T (+ bias)`` whose weight gradient goes into ``weight.main_grad``.

    ``allreduce_dgrad`` all-reduces the input gradient over ``tp_group`` (a column-parallel layer
    under tensor parallelism without sequence parallelism), overlapped with the weight gradient.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, allreduce_dgrad: bool, tp_group):
        ctx.save_for_backward(input)
        # The parameter itself, not a saved tensor: saved-tensor hooks (torch's non-reentrant
        # checkpoint, offloading) hand back a tensor without ``main_grad``.
        ctx.weight = weight
        ctx.use_bias = bias is not None
        ctx.allreduce_dgrad = allreduce_dgrad
        ctx.tp_group = tp_group
        output = torch.matmul(input, weight.t())
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        weight = ctx.weight
        grad_input = grad_output.matmul(weight)
        handle = None
        if ctx.allreduce_dgrad:
            handle = torch.distributed.all_reduce(grad_input, group=ctx.tp_group, async_op=True)
        grad_output, input = prepare_input_tensors_for_wgrad_compute(grad_output, input)
        grad_weight = accumulate_weight_grad(weight, grad_output, input)
        grad_bias = grad_output.sum(dim=0) if ctx.use_bias else None
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, grad_bias, None, None


def _main_grad_linear(input, weight, args: tuple, kwargs: dict):
    """:class:`MainGradLinear` of megatron-core's ``_forward_impl`` arguments, or None where
    :func:`covers` does not hold (the caller runs megatron-core's function)."""
    options = dict(zip(("bias", "gradient_accumulation_fusion", "allreduce_dgrad",
                        "sequence_parallel", "grad_output_buffer"), args))
    options.update(kwargs)
    if not covers(weight, options.get("gradient_accumulation_fusion", False),
                  options.get("sequence_parallel", False), options.get("grad_output_buffer")):
        return None
    return MainGradLinear.apply(input, weight, options.get("bias"),
                                bool(options.get("allreduce_dgrad", False)), options.get("tp_group"))


class SeamColumnParallelLinear(ColumnParallelLinear):
    """``ColumnParallelLinear`` whose weight gradient goes into ``main_grad`` (module docstring)."""

    def _forward_impl(self, input, weight, *args, **kwargs):
        output = _main_grad_linear(input, weight, args, kwargs)
        return super()._forward_impl(input, weight, *args, **kwargs) if output is None else output


class SeamRowParallelLinear(RowParallelLinear):
    """``RowParallelLinear`` whose weight gradient goes into ``main_grad`` (module docstring)."""

    def _forward_impl(self, input, weight, *args, **kwargs):
        output = _main_grad_linear(input, weight, args, kwargs)
        return super()._forward_impl(input, weight, *args, **kwargs) if output is None else output


_REPLACEMENTS = {ColumnParallelLinear: SeamColumnParallelLinear, RowParallelLinear: SeamRowParallelLinear}


def adopt(model: torch.nn.Module) -> int:
    """Make every module of ``model`` whose class is exactly megatron-core's
    ``ColumnParallelLinear`` / ``RowParallelLinear`` the seam's subclass (no state changes: the
    subclass only overrides the matmul). Returns how many were adopted."""
    adopted = 0
    for module in model.modules():
        seam_class = _REPLACEMENTS.get(type(module))
        if seam_class is not None:
            module.__class__ = seam_class
            adopted += 1
    return adopted
