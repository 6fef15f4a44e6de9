"""The torch engine's side of the kernel seam.

- :func:`swap_modules`: replaces the RMSNorm modules of a transformers / diffusers / torch model
  (``LlamaRMSNorm``, ``Qwen2RMSNorm``, ``Qwen3RMSNorm``, diffusers' ``RMSNorm``,
  ``torch.nn.RMSNorm``, ...) by :class:`SeamRMSNorm` when ``kernels.rms_norm`` is not the plain
  ``torch``; the parameter (``weight``) is the same object, so state dicts and checkpoints do
  not change. The torch engine calls it on every model it builds.
  It also replaces their SiLU-gated MLPs (``LlamaMLP``, ``Qwen2MLP``, ...: ``gate_proj`` /
  ``up_proj`` / ``down_proj`` and a SiLU ``act_fn``) by :class:`SeamGatedMLP` when ``swiglu``
  is not plain, and routes their rotate-half RoPE through ``kernels.rope`` when ``rope`` is not
  plain (:mod:`loong_core.kernels.hf_rope`).
- :func:`gated_mlp`: ``down(silu(gate(x)) * up(x))``, through ``kernels.swiglu`` when that op is
  not plain (loong's own gated MLPs call it too).
- :func:`norm_modulate`: ``norm(x) * (1 + scale) + shift`` of loong's own DiTs and action heads,
  fused as ``kernels.layer_norm_modulate`` when that op is not plain (bit-identical to the
  plain expression otherwise).

Not replaced (the ops compute something else): Gemma's ``1 + weight`` RMSNorm and gelu-tanh gated
MLP, diffusers' GELU feed-forwards and complex / interleaved RoPE, RoPE with an attention scaling
(YaRN, LongRoPE), transformers' multimodal RoPE functions.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
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


def gated_mlp(gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module,
              x: torch.Tensor) -> torch.Tensor:
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``, the activation through ``kernels.swiglu``
    when that op is not plain (the op reads ``[gate; up]``, so the two projections are
    concatenated; the plain path is the unfused expression, bit for bit)."""
    if kernels.is_plain("swiglu"):
        return down_proj(F.silu(gate_proj(x)) * up_proj(x))
    return down_proj(kernels.get("swiglu")(torch.cat([gate_proj(x), up_proj(x)], dim=-1)))


class SeamGatedMLP(nn.Module):
    """A SiLU-gated MLP through :func:`gated_mlp`, holding another MLP's three projections (the
    same modules: state-dict keys and checkpoints do not change)."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_mlp(self.gate_proj, self.up_proj, self.down_proj, x)

    def extra_repr(self) -> str:
        return f"backend={kernels.backend('swiglu')}"


_MLP_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn"}


def _is_silu_gated_mlp(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers-style ``down(act(gate(x)) * up(x))`` MLP with SiLU."""
    if not type(module).__name__.endswith("MLP") or isinstance(module, SeamGatedMLP):
        return False
    children = dict(module.named_children())
    if set(children) != _MLP_CHILDREN:
        return False
    if not all(isinstance(children[n], nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
        return False
    return type(children["act_fn"]).__name__ in ("SiLU", "SiLUActivation")


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def swap_modules(model: nn.Module) -> list[str]:
    """Route the RMSNorms, SiLU-gated MLPs and rotate-half RoPE of ``model`` through the seam,
    for each op that is not plain (nothing changes when all three are).

    Returns:
        The qualified names of the replaced or hooked modules.
    """
    replaced: dict[str, list[str]] = {"rms_norm": [], "swiglu": [], "rope": []}
    for name, module in list(model.named_modules()):
        if not name:
            continue
        if not kernels.is_plain("rms_norm"):
            eps = _rms_norm_eps(module)
            if eps is not None:
                _replace(model, name, SeamRMSNorm(module.weight, eps))
                replaced["rms_norm"].append(name)
                continue
        if not kernels.is_plain("swiglu") and _is_silu_gated_mlp(module):
            _replace(model, name, SeamGatedMLP(module.gate_proj, module.up_proj, module.down_proj))
            replaced["swiglu"].append(name)
    if not kernels.is_plain("rope"):
        from loong_core.kernels.hf_rope import route_rotary

        replaced["rope"] = route_rotary(model)
    for op, names in replaced.items():
        if names:
            logger.info("kernels: %d %s modules use %s=%s", len(names),
                        {"rms_norm": "RMSNorm", "swiglu": "gated MLP", "rope": "rotary"}[op], op,
                        kernels.backend(op))
    return [name for names in replaced.values() for name in names]


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
