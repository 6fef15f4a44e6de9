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


def always() -> bool:
    """Pure-torch backends (``chunked``) run on every device."""
    return True
