"""The generic ``compile`` backend: each reference under ``torch.compile`` (compiled lazily, on
the first call, once per op)."""

from __future__ import annotations

import functools

import torch

from loong_core.kernels import reference


def _compiled(name: str):
    fn = getattr(reference, name)
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=None)
        return compiled(*args, **kwargs)

    call.__doc__ = f"``{name}`` of :mod:`loong_core.kernels.reference` under torch.compile."
    return call


rms_norm = _compiled("rms_norm")
swiglu = _compiled("swiglu")
rope = _compiled("rope")
layer_norm_modulate = _compiled("layer_norm_modulate")
cross_entropy = _compiled("cross_entropy")
linear_cross_entropy = _compiled("linear_cross_entropy")
