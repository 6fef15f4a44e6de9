"""Fixtures: the fake Kunlun stack (``fake_vendor/``) on or off ``sys.path`` for one test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loong_core.testing import keep_cpu_precision_fp32

keep_cpu_precision_fp32()

FAKE_VENDOR = Path(__file__).parent / "fake_vendor"
FAKE_RUNTIME = "fake_kunlun_runtime:CPUKunlunRuntime"
_VENDOR_MODULES = ("torch_xmlir", "kunlun_ops", "fake_kunlun_runtime")


def _forget_vendor_modules() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in _VENDOR_MODULES:
            del sys.modules[name]


@pytest.fixture
def no_vendor(monkeypatch):
    """This machine as it is: no Kunlun stack (fails the test if one is really installed)."""
    import importlib.util

    monkeypatch.delenv("LOONG_XPU_RUNTIME", raising=False)
    monkeypatch.delenv("LOONG_DEVICE", raising=False)
    _forget_vendor_modules()
    if importlib.util.find_spec("torch_xmlir") is not None:
        pytest.skip("a real torch_xmlir is installed here")
    from loong_core.kernels import resolve

    monkeypatch.setattr(resolve, "_AVAILABLE", {})
    yield


@pytest.fixture
def fake_vendor(monkeypatch):
    """The fake torch_xmlir / kunlun_ops importable and the CPU runtime selected."""
    monkeypatch.syspath_prepend(str(FAKE_VENDOR))
    monkeypatch.setenv("LOONG_XPU_RUNTIME", FAKE_RUNTIME)
    monkeypatch.delenv("LOONG_DEVICE", raising=False)
    from loong_core.kernels import resolve

    monkeypatch.setattr(resolve, "_AVAILABLE", {})
    yield FAKE_VENDOR
    _forget_vendor_modules()
