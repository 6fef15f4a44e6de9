"""The device-backend contract: everything device-specific the engines and trainer need."""

from __future__ import annotations

import contextlib
from typing import Any


class DeviceBackend:
    """A device type loong can train on.

    Subclasses set ``name`` and ``dist_backend`` and override what differs. One instance is
    created per process by :func:`loong_core.devices.select.select_device`.

    Attributes:
        name: Registered name.
        dist_backend: ``torch.distributed`` process-group backend.
    """

    name = "base"
    dist_backend = "gloo"

    @classmethod
    def is_available(cls) -> bool:
        """Whether this machine has the device."""
        return False

    def __init__(self, local_rank: int = 0, num_threads: int | None = None):
        self.local_rank = local_rank
        self.num_threads = num_threads

    def setup(self) -> None:
        """Bind this process to its device and adapt libraries to it (once, before models)."""

    @property
    def torch_device(self) -> Any:
        """The ``torch.device`` of this process."""
        raise NotImplementedError

    @property
    def default_dtype(self) -> Any:
        """Dtype for parameters and compute by default on this device."""
        import torch

        return torch.float32

    @property
    def fast_bf16(self) -> bool:
        """Whether bf16 matmuls are faster than fp32 here (``parallel.mixed_precision=auto``
        then trains in bf16)."""
        return False

    def manual_seed(self, seed: int) -> None:
        """Seed host and device generators."""
        import torch

        torch.manual_seed(seed)

    def rng_state(self) -> dict:
        """Device RNG state to checkpoint (host RNG is saved by the trainer)."""
        return {}

    def set_rng_state(self, state: dict) -> None:
        """Restore what :meth:`rng_state` returned."""

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    def memory_stats(self) -> dict[str, float]:
        """Memory in GiB: at least ``mem_gib`` (current) and ``max_mem_gib``."""
        return {}

    def peak_flops(self, dtype: Any) -> float:
        """Peak dense matmul FLOP/s of one device for ``dtype`` (for MFU)."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the banner."""
        return self.name

    def autocast(self) -> Any:
        """Context manager for mixed precision (none by default)."""
        return contextlib.nullcontext()
