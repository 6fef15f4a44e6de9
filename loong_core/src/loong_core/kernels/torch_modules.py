"""The torch engine's side of the kernel seam.

- :func:`swap_modules`: replaces the RMSNorm modules of a transformers / diffusers / torch model
  (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm``, diffusers' ``RMSNorm``,
  ``torch.nn.RMSNorm``, ...) by :class:`SeamRMSNorm` when ``kernels.rms_norm`` is not the plain
  ``torch``; the parameter (``weight``) is the same object, so state dicts and checkpoints do
  not change. The torch engine calls it on every model it builds.
- :func:`norm_modulate`: ``norm(x) * (1 + scale) + shift`` of loong's own DiTs and action heads,
  fused as ``kernels.layer_norm_modulate`` when that op is not plain (bit-identical to the
  plain expression otherwise).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from loong_core import kernels

logger = logging.getLogger(__name__)


class SeamRMSNorm(nn.Module):
    """RMSNorm through ``kernels.get("rms_norm")`` holding another module's ``weight``.

    Args:
        weight: The replaced module's weight ``[d]`` (shared, not copied).
        eps: Its epsilon.
    """

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.get("rms_norm")(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, backend={kernels.backend('rms_norm')}"


def _rms_norm_eps(module: nn.Module) -> float | None:
    """The epsilon of an RMSNorm whose output is ``weight * x / rms(x)`` (None otherwise)."""
    name = type(module).__name__
    if not name.endswith("RMSNorm") or name.startswith("Gemma") or isinstance(module, SeamRMSNorm):
        return None  # Gemma's RMSNorm scales by (1 + weight)
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        return None
    if getattr(module, "bias", None) is not None or list(module.children()):
        return None
    for attr in ("variance_epsilon", "eps"):
        eps = getattr(module, attr, None)
        if isinstance(eps, (int, float)):
            return float(eps)
    if isinstance(module, nn.RMSNorm):
        return torch.finfo(weight.dtype).eps if module.eps is None else module.eps
    return None


def swap_modules(model: nn.Module) -> list[str]:
    """Replace the RMSNorms of ``model`` by seam-backed ones (nothing when ``rms_norm`` is plain).

    Returns:
        The qualified names of the replaced modules.
    """
    if kernels.is_plain("rms_norm"):
        return []
    replaced = []
    for name, module in list(model.named_modules()):
        eps = _rms_norm_eps(module)
        if eps is None or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, SeamRMSNorm(module.weight, eps))
        replaced.append(name)
    if replaced:
        logger.info("kernels: %d RMSNorm modules use rms_norm=%s", len(replaced),
                    kernels.backend("rms_norm"))
    return replaced


def norm_modulate(norm: nn.LayerNorm, x: torch.Tensor, shift: torch.Tensor,
                  scale: torch.Tensor) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift`` (adaLN), through ``kernels.layer_norm_modulate`` when
    that op is not plain.

    Args:
        norm: The ``nn.LayerNorm`` (its eps and optional affine are used).
        x: ``[b, s, d]``.
        shift: ``[b, 1, d]`` or ``[b, s, d]``.
        scale: Same shape as ``shift``.
    """
    if kernels.is_plain("layer_norm_modulate"):
        return norm(x) * (1 + scale) + shift
    return kernels.get("layer_norm_modulate")(x, shift, scale, norm.eps, norm.weight, norm.bias)
