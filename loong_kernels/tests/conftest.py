"""Kernel tests run Triton in its CPU interpreter, without changing other packages' tests.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel: the kernel modules are
imported here, at collection, with it set, and the variable is restored afterwards. While this
package's tests run it is set again (``triton_available()`` and the processes the tests start
read it) and restored after each module.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from loong_core.testing import keep_cpu_precision_fp32
from loong_kernels.plugin import TRITON_OPS

keep_cpu_precision_fp32()

_saved = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
for _op in TRITON_OPS:
    importlib.import_module(f"loong_kernels.triton.{_op}")
if _saved is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _saved


@pytest.fixture(scope="module", autouse=True)
def _interpret():
    """``TRITON_INTERPRET=1`` during this package's tests only."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)
