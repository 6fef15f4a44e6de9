"""Availability predicates (``() -> bool``) of core's backends; light until called."""

from __future__ import annotations

import importlib.util
import shutil
import sys


def always() -> bool:
    """The torch references run everywhere."""
    return True


def compile_available() -> bool:
    """``torch.compile`` works here: dynamo supports this Python and inductor finds a C++
    compiler for CPU code (CUDA code needs triton)."""
    if sys.platform == "win32" or importlib.util.find_spec("torch") is None:
        return False
    import torch

    if not hasattr(torch, "compile") or not torch._dynamo.is_dynamo_supported():
        return False
    return any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


def flex_available() -> bool:
    """FlexAttention exists in this torch and can be compiled (it is only fast compiled)."""
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    return compile_available()
