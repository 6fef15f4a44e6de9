"""megatron-core's gated SiLU (``silu(gate) * up`` of fc1's ``[gate; up]``) with its own backward.

megatron-core's MLP splits the fc1 output with ``torch.chunk`` and multiplies ``silu(gate)`` by
``up + glu_linear_offset`` (a copy of ``up`` even when the offset is 0); in the backward,
autograd joins the two halves' gradients with ``cat`` (a copy of the whole ``[tokens, 2F]``
gradient per layer). :class:`GatedSiLU` computes the same products with the same kernels
(forward and gradients bit-identical to megatron-core's, in fp32 and bf16, tested; only an
``up`` of exactly ``-0.0``, which megatron-core's ``+ 0.0`` turns into ``+0.0``, can give a zero
of the other sign) and writes the two gradients straight into their halves of one buffer. On the
default CPU experiment that removes about 1-2% of a step. Used by :class:`~.modules.SeamSwiGLU`
while ``kernels.swiglu`` is ``torch``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GatedSiLU(torch.autograd.Function):
    """``silu(x[..., :F]) * x[..., F:]`` of ``x [..., 2F]``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.chunk(x, 2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(gate, up, activated)
        return activated * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up, activated = ctx.saved_tensors
        half = grad.shape[-1]
        grad_x = grad.new_empty(*grad.shape[:-1], 2 * half)
        # d/dgate: silu'(gate) * (grad * up); d/dup: grad * silu(gate) (autograd's products).
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_x[..., :half])
        torch.mul(grad, activated, out=grad_x[..., half:])
        return grad_x


def covers(config) -> bool:
    """:class:`GatedSiLU` is megatron-core's MLP activation for ``config``: gated SiLU without
    a clamp or a linear offset."""
    return (bool(config.gated_linear_unit) and config.activation_func is F.silu
            and getattr(config, "activation_func_clamp_value", None) is None
            and getattr(config, "glu_linear_offset", 0.0) == 0.0)


def apply(x: torch.Tensor) -> torch.Tensor:
    """Gated SiLU of megatron-core's fc1 output ``x [..., 2F]`` -> ``[..., F]``."""
    return GatedSiLU.apply(x)
