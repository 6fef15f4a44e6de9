"""Kernel tests run Triton in its CPU interpreter: set before any kernel module is imported.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a kernel, so it is set here, at
collection, for this package's tests only (and inherited by the processes they start).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)
