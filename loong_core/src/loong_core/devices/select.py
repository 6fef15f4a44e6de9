"""Choose the device backend: ``device=`` in config, else ``$LOONG_DEVICE``, else the best one."""

from __future__ import annotations

import os

from loong_core.devices.base import DeviceBackend
from loong_core.errors import ConfigError
from loong_core.plugins import get_registry


def resolve_device_name(requested: str = "auto", _source: str = "device") -> str:
    """Return the backend name to use for ``requested`` (``auto`` or a registered name).

    A named backend that is not available is an error with the backend's own reason (never a
    silent fall-back to another device).
    """
    registry = get_registry()
    if requested and requested != "auto":
        entry = registry.get("device", requested, "device.name")
        backend = entry.load()
        if not backend.is_available():
            raise ConfigError(
                f"device '{requested}' is not available on this machine: "
                f"{backend.unavailable_reason()}. Choose another with {_source}=cpu, or "
                f"{'unset LOONG_DEVICE' if _source == 'LOONG_DEVICE' else 'device=auto'} to pick "
                f"the best available."
            )
        return requested
    env = os.environ.get("LOONG_DEVICE")
    if env:
        return resolve_device_name(env, "LOONG_DEVICE")
    ranked = sorted(registry.entries("device"), key=lambda e: -int(e.meta.get("priority", 0)))
    for entry in ranked:
        try:
            if entry.load().is_available():
                return entry.name
        except Exception:  # a backend that cannot even be imported is not available
            continue
    raise ConfigError("No device backend is available (not even 'cpu').")


def select_device(requested: str = "auto", local_rank: int = 0, num_threads: int | None = None,
                  peak_tflops: float | None = None) -> DeviceBackend:
    """Instantiate the chosen backend for this process (not yet set up)."""
    name = resolve_device_name(requested)
    cls = get_registry().get("device", name).load()
    return cls(local_rank=local_rank, num_threads=num_threads, peak_tflops=peak_tflops)
