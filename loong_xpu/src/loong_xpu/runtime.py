"""Kunlun's PyTorch runtime as loong reaches it: detection, activation and the cuda-compatible API.

Kunlun's stack (``xpytorch``, Python package ``torch_xmlir``) patches torch when it is imported so
that the card appears as device type ``cuda``: ``torch.cuda.*`` reaches the XPU and
``torch.distributed`` backend ``nccl`` runs on BKCL. The xpu backend therefore talks to
``torch.cuda`` through one :class:`KunlunRuntime` object, and nowhere else.

``LOONG_XPU_RUNTIME=module:attr`` substitutes another runtime (a class with the same members):
the tests use :class:`loong_xpu.testing.CPUKunlunRuntime` to run this backend's code on CPU, and
bring-up work on a new software release can wrap the vendor's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

VENDOR_PACKAGE = "torch_xmlir"
RUNTIME_ENV = "LOONG_XPU_RUNTIME"
INSTALL_HINT = ("Kunlun's PyTorch stack is not installed (no Python package 'torch_xmlir'): install "
                "the xpytorch / torch_xmlir wheels of the card's software release for this Python "
                "and torch, as docs/xpu.md describes")


def vendor_installed() -> bool:
    """Whether ``torch_xmlir`` can be imported (found without importing it: it patches torch)."""
    return importlib.util.find_spec(VENDOR_PACKAGE) is not None


class KunlunRuntime:
    """The vendor runtime behind ``torch.cuda`` once ``torch_xmlir`` is imported.

    Attributes:
        device_type: torch device type of the card (``cuda``: the vendor presents it so).
        dist_backend: ``torch.distributed`` backend (``nccl``, BKCL underneath).
    """

    device_type = "cuda"
    dist_backend = "nccl"

    def activate(self) -> None:
        """Import the vendor package, which patches torch (idempotent)."""
        importlib.import_module(VENDOR_PACKAGE)

    @property
    def api(self) -> Any:
        """The ``torch.cuda``-shaped module every device call goes through."""
        import torch

        return torch.cuda

    def device(self, index: int) -> Any:
        """``torch.device`` of card ``index`` (as this process sees it)."""
        import torch

        return torch.device(self.device_type, index)

    def total_memory(self, index: int) -> int:
        """Bytes of memory of card ``index``."""
        return int(self.api.get_device_properties(index).total_memory)


def load_runtime() -> KunlunRuntime:
    """The runtime the xpu backend uses: ``$LOONG_XPU_RUNTIME`` if set, else :class:`KunlunRuntime`."""
    target = os.environ.get(RUNTIME_ENV)
    if not target:
        return KunlunRuntime()
    module, _, attr = target.partition(":")
    from loong_core.errors import ConfigError

    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{RUNTIME_ENV}={target} does not name a runtime ('module:attr'): {exc}. "
                          f"Unset it to use Kunlun's runtime.") from None
    return factory()
