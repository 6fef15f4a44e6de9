"""Fake ``torch_xmlir`` (tests only): registers the custom ops loong_xpu uses; no torch patches."""

from __future__ import annotations

import torch

IMPORTED = True
__version__ = "0.0-fake"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _unrotate_half(x: torch.Tensor) -> torch.Tensor:  # the transpose of _rotate_half
    first, second = x.chunk(2, dim=-1)
    return torch.cat((second, -first), dim=-1)


def rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, out: torch.Tensor) -> None:
    """``out = t * cos(freqs) + rotate_half(t) * sin(freqs)``; ``freqs`` covers all of ``t``."""
    x, f = t.float(), freqs.float()
    out.copy_((x * f.cos() + _rotate_half(x) * f.sin()).to(out.dtype))


def rotary_pos_emb_backward(grad: torch.Tensor, freqs: torch.Tensor, out: torch.Tensor) -> None:
    """Gradient of :func:`rotary_pos_emb` with respect to ``t``."""
    g, f = grad.float(), freqs.float()
    out.copy_((g * f.cos() + _unrotate_half(g * f.sin())).to(out.dtype))


# Registered once per process (torch keeps operators for good; a re-import must not redefine them).
for _fn in (rotary_pos_emb, rotary_pos_emb_backward):
    if not hasattr(torch.ops.custom_ops, _fn.__name__):
        torch.library.custom_op(f"custom_ops::{_fn.__name__}", _fn, mutates_args=("out",))
