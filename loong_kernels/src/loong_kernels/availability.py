"""Availability predicates of the kernel backends (``"module:attr"`` targets of the registry)."""

from __future__ import annotations

import importlib.util
import os


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_available() -> bool:
    """Triton kernels run here: triton imports and a CUDA device is present, or Triton interprets.

    The interpreter makes the kernels selectable on CPU for tests; the seam's ``auto`` does not
    pick them in that mode.
    """
    if importlib.util.find_spec("triton") is None:
        return False
    if interpreting():
        return True
    import torch

    return torch.cuda.is_available()


def fla_available() -> bool:
    """flash-linear-attention runs here: ``fla`` and ``einops`` are installed (extra ``fla``) and a
    CUDA device is present. Off CUDA it is never available: fla 0.6.0 runs in Triton's
    interpreter only with two test-only patches (its autotuner's benchmark needs a GPU driver,
    and one kernel calls ``.to`` on a ``range`` counter; ``tests/test_gated_delta_rule_fla.py``)."""
    if any(importlib.util.find_spec(m) is None for m in ("fla", "einops", "triton")):
        return False
    import torch

    return torch.cuda.is_available()


def always() -> bool:
    """Pure-torch backends (``chunked``) run on every device."""
    return True
