"""The ``kernels`` plugin registers every Triton op and the chunked linear cross entropy."""

from __future__ import annotations

import importlib

from loong_core.plugins import get_plugin_system
from loong_kernels.availability import triton_available
from loong_kernels.plugin import TRITON_OPS


def test_every_kernel_is_registered_with_its_reference_and_predicate():
    registry = get_plugin_system(reload=True).registry()
    names = set(registry.names("kernel"))
    expected = {f"{op}:triton" for op in TRITON_OPS} | {"linear_cross_entropy:chunked", "gated_delta_rule:fla"}
    assert expected <= names
    for name in expected:
        entry = registry.get("kernel", name)
        op = name.split(":")[0]
        assert entry.meta["reference"] == f"loong_core.kernels.reference:{op}"
        assert callable(entry.load())
        module, attr = entry.meta["available"].split(":")
        assert callable(getattr(importlib.import_module(module), attr))


def test_triton_ops_cover_the_seam_except_attention_and_the_gated_delta_rule():
    from loong_core.kernels.ops import OPS

    assert set(TRITON_OPS) == set(OPS) - {"attention", "gated_delta_rule"}  # the latter: fla


def test_triton_is_available_in_the_interpreter(monkeypatch):
    assert triton_available()  # conftest sets TRITON_INTERPRET=1; this machine may have no GPU
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    import torch

    assert triton_available() == torch.cuda.is_available()
