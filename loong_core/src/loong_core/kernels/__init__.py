"""The kernel seam: model code asks for an op, the run's config decides the implementation.

Model code calls::

    from loong_core import kernels
    y = kernels.get("rms_norm")(x, weight, eps)

The choice is made once per process: ``loong train`` calls :func:`configure` with the run's
``kernels`` config section and device before any model is built. Without that call (unit tests,
``loong convert``, notebooks) the first :func:`get` resolves every op as ``auto`` for the device
type of the backend ``device=auto`` would pick (``$LOONG_DEVICE``, else the best available),
unless ``$LOONG_KERNELS`` gives choices (``"rms_norm=triton,attention=flex"``).

Ops and their signatures: :mod:`loong_core.kernels.reference` (``attention`` also in
:mod:`loong_core.kernels.attention`). This module imports no torch until a kernel is loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from loong_core.kernels.ops import OPS, PLAIN

logger = logging.getLogger(__name__)

__all__ = ["OPS", "PLAIN", "configure", "get", "backend", "resolved", "is_plain", "reset"]

_choices: dict | None = None
_loaded: dict[str, Callable] = {}


def _requested(section: Any) -> dict[str, str]:
    if section is None:
        raw = os.environ.get("LOONG_KERNELS", "")
        pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
        return {k.strip(): v.strip() for k, v in pairs}
    if isinstance(section, dict):
        return dict(section)
    return {op: getattr(section, op) for op in OPS if hasattr(section, op)}


def _default_device() -> str:
    from loong_core.devices.select import select_device

    return select_device("auto").device_type  # the backend loong would train on here


def configure(section: Any = None, device_type: str | None = None, registry=None,
              train_steps: int | None = None, keep: dict[str, str] | None = None) -> dict:
    """Resolve every op for this process.

    Args:
        section: The run's ``KernelsConfig`` (or a mapping ``op -> backend``); None reads
            ``$LOONG_KERNELS``.
        device_type: ``cpu``, ``cuda``, ... (None: what torch sees).
        registry: Plugin registry (default: the process's).
        train_steps: The run's ``trainer.train_iters``: ``auto`` picks a backend registered
            with ``auto_min_steps`` (``compile`` on CPU) only for runs that long; None (no
            ``loong train``) never does.
        keep: ``op -> backend`` of the checkpoint a run resumes (same device type): ops left at
            ``auto`` keep them where available, so the continuation is bit-exact even when
            ``train_steps`` moved across a backend's ``auto_min_steps``.

    Returns:
        ``op -> Choice`` (see :mod:`loong_core.kernels.resolve`).

    Raises:
        ConfigError: an unknown backend, or one not available on this device.
    """
    global _choices
    from loong_core.kernels.resolve import resolve_all

    if registry is None:
        from loong_core.plugins import get_plugin_system

        registry = get_plugin_system().registry()
    choices = resolve_all(_requested(section), device_type or _default_device(), registry, train_steps, keep)
    _choices = choices
    _loaded.clear()
    logger.debug("kernels: %s", ", ".join(f"{op}={c.backend}" for op, c in choices.items()))
    return choices


def _ensure() -> dict:
    if _choices is None:
        configure()
    return _choices


def get(op: str) -> Callable:
    """The resolved implementation of ``op`` (loaded on first use).

    Raises:
        KeyError: ``op`` is not an op of the seam.
    """
    if op not in OPS:
        raise KeyError(f"Unknown kernel op {op!r}; ops: {', '.join(OPS)}")
    fn = _loaded.get(op)
    if fn is None:
        fn = _loaded[op] = _ensure()[op].entry.load()
    return fn


def backend(op: str) -> str:
    """The backend name resolved for ``op``."""
    return _ensure()[op].backend


def is_plain(op: str) -> bool:
    """Whether ``op`` runs its plain backend (``torch``; ``sdpa`` for attention), so that model
    code may keep the library's own module instead of a seam-backed one."""
    return backend(op) == PLAIN[op]


def resolved() -> dict[str, str]:
    """``op -> backend`` for every op."""
    return {op: c.backend for op, c in _ensure().items()}


def reset() -> None:
    """Forget the resolution (tests; the next :func:`get` resolves again)."""
    global _choices
    _choices = None
    _loaded.clear()
