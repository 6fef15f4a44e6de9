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
    """FlexAttention exists in this torch, can be compiled (it is only fast compiled) and a CUDA
    device is present: torch 2.13's FlexAttention has no backward on CPU, so it cannot train
    there (its forward still runs, for inference and tests)."""
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    import torch

    return torch.cuda.is_available() and compile_available()
