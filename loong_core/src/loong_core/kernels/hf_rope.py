"""transformers' rotate-half RoPE through ``kernels.rope`` (torch engine).

transformers models compute ``(cos, sin)`` once per forward in their ``*RotaryEmbedding`` module and
rotate queries and keys in each attention layer with their modeling module's
``apply_rotary_pos_emb(q, k, cos, sin)``. The ``rope`` op takes the angles, not their cosines, in
megatron-core's ``[s, b, h, d]`` layout. :func:`route_rotary` therefore

- hooks every rotary-embedding module whose output is ``cos(angles)``, ``sin(angles)`` (the
  default and llama3 rope types: an ``attention_scaling`` of 1): the hook recomputes the angles
  exactly as the module does (``position_ids * inv_freq``, both halves) and attaches them to the
  ``cos`` tensor it returns;
- wraps the ``apply_rotary_pos_emb`` of those modules' modeling files: with angles attached to
  ``cos`` it calls :func:`rotary` (the op on permuted views), otherwise the original function.

:func:`rotary` is also what loong's own torch models call for a rotate-half RoPE on
transformers' ``(cos, sin)`` (the Pi0.5 action expert).
"""

from __future__ import annotations

import inspect
import logging
import sys

import torch
from torch import nn

from loong_core import kernels

logger = logging.getLogger(__name__)

#: Attribute of a ``cos`` tensor that holds its fp32 angles ``[b, s, d]``.
ANGLES = "_loong_rope_angles"
_ORIGINAL = "_loong_original"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` of ``x`` ``[b, h, s, d]`` with ``cos`` / ``sin``
    ``[b or 1, s, d]`` (transformers' layout), through ``kernels.rope`` when that op is not
    plain and ``cos`` carries its angles; the plain expression otherwise."""
    angles = getattr(cos, ANGLES, None)
    if (angles is None or kernels.is_plain("rope") or unsqueeze_dim != 1 or x.dim() != 4
            or angles.shape[-1] != x.shape[-1]):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return (x * cos) + (_rotate_half(x) * sin)
    freqs = angles.permute(1, 0, 2).unsqueeze(2)           # [s, b or 1, 1, d]
    out = kernels.get("rope")(x.permute(2, 0, 1, 3), freqs)  # [s, b, h, d]
    return out.permute(1, 2, 0, 3)


def _attach_angles(module: nn.Module, args: tuple, kwargs: dict, output):
    position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    if position_ids is None or not isinstance(output, tuple) or len(output) != 2:
        return output
    cos = output[0]
    freqs = position_ids[..., None].float() * module.inv_freq.to(device=cos.device, dtype=torch.float)
    angles = torch.cat((freqs, freqs), dim=-1)
    if angles.shape == cos.shape:
        setattr(cos, ANGLES, angles)
    return output


def _is_rotate_half_rotary(module: nn.Module) -> bool:
    return (type(module).__name__.endswith("RotaryEmbedding")
            and isinstance(getattr(module, "inv_freq", None), torch.Tensor)
            and getattr(module, "attention_scaling", None) == 1.0
            and getattr(module, "rope_type", "default") in ("default", "llama3")
            and "Multimodal" not in type(module).__name__)


def _wrap(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if getattr(cos, ANGLES, None) is None or args or set(kwargs) - {"unsqueeze_dim"}:
            return original(q, k, cos, sin, *args, **kwargs)
        dim = kwargs.get("unsqueeze_dim", 1)
        return rotary(q, cos, sin, dim), rotary(k, cos, sin, dim)

    setattr(apply_rotary_pos_emb, _ORIGINAL, original)
    apply_rotary_pos_emb.__doc__ = original.__doc__
    return apply_rotary_pos_emb


def _patch_modeling_module(name: str) -> bool:
    """Wrap ``apply_rotary_pos_emb`` of module ``name`` once; whether it has one."""
    module = sys.modules.get(name)
    fn = getattr(module, "apply_rotary_pos_emb", None)
    if fn is None:
        return False
    if getattr(fn, _ORIGINAL, None) is None:
        params = list(inspect.signature(fn).parameters)
        if params[:4] != ["q", "k", "cos", "sin"]:
            return False
        module.apply_rotary_pos_emb = _wrap(fn)
    return True


def route_rotary(model: nn.Module) -> list[str]:
    """Hook the rotate-half rotary embeddings of ``model`` and wrap their modeling module's
    ``apply_rotary_pos_emb`` (see the module docstring).

    Returns:
        The qualified names of the hooked rotary-embedding modules.
    """
    hooked = []
    for name, module in model.named_modules():
        if not name or not _is_rotate_half_rotary(module) or getattr(module, ANGLES, False):
            continue
        module.register_forward_hook(_attach_angles, with_kwargs=True)
        setattr(module, ANGLES, True)
        if not _patch_modeling_module(type(module).__module__):
            logger.debug("kernels: %s has no apply_rotary_pos_emb(q, k, cos, sin) to route", name)
        hooked.append(name)
    return hooked
