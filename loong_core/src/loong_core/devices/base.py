"""The device-backend contract: everything device-specific the engines and trainer need.

``docs/devices.md`` is the written contract; :mod:`loong_core.testing_devices` is its conformance
suite, which every backend package runs against its backend. The trainer and the engines reach
the device only through these members, never through ``torch.cuda`` or a device-type string.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any


class DeviceBackend:
    """A device type loong can train on.

    Subclasses set the class attributes and override what differs. One instance is created per
    process by :func:`loong_core.devices.select.select_device`; :meth:`setup` runs once, before
    the process group and any model exist.

    Attributes:
        name: Registered name (``device=<name>``, ``LOONG_DEVICE=<name>``).
        dist_backend: ``torch.distributed`` process-group backend (``gloo``, ``nccl``; a vendor
            runtime may put its own collective library behind ``nccl``).
        visible_devices_var: Environment variable that restricts which devices a process sees
            (``CUDA_VISIBLE_DEVICES``), or None where there is none (CPU). loong never sets it:
            the launcher or the site does.
        fused_optimizers: torch's fused optimizer kernels run on this device, so
            ``optim.implementation=auto`` takes them (a vendor runtime that presents its card as
            another device type may lack them: it sets False and ``auto`` keeps torch's default).
        pinned_host_memory: Host copies of device tensors (an asynchronous checkpoint's snapshot)
            go to page-locked memory, which this device copies into faster.
        side_streams: megatron-core's options that overlap work on a CUDA side stream
            (``moe_shared_expert_overlap``) run on this device; elsewhere the megatron engine
            turns them off with a warning.
    """

    name = "base"
    dist_backend = "gloo"
    visible_devices_var: str | None = None
    fused_optimizers = True
    pinned_host_memory = False
    side_streams = False

    @classmethod
    def is_available(cls) -> bool:
        """Whether this machine can use the device. Must be cheap: it runs for every backend when
        the device is chosen automatically, so it must not initialise a runtime it does not need."""
        return False

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why :meth:`is_available` is false and what to install or change, as one clause
        (``device=<name>`` fails with "device '<name>' is not available on this machine: <reason>")."""
        return "this machine does not have it"

    def __init__(self, local_rank: int = 0, num_threads: int | None = None,
                 peak_tflops: float | None = None):
        """One backend for this process (not set up yet).

        Args:
            local_rank: This process's device among the visible ones.
            num_threads: ``device.num_threads`` (host threads; the cpu backend uses it).
            peak_tflops: ``device.peak_tflops``, a peak the user gives; it wins over the
                backend's own in :meth:`peak_flops`.
        """
        self.local_rank = local_rank
        self.num_threads = num_threads
        self.peak_tflops = peak_tflops

    def setup(self) -> None:
        """Prepare this process for the device, once, before process groups and models exist.

        Applies :meth:`environment_defaults` (``os.environ.setdefault``: a value the user or the
        site set is never changed), binds the process to its device (``local_rank``) and applies
        the backend's process-wide library adaptations (the ``cpu`` backend's megatron-core
        redirects, a vendor runtime's import). Subclasses call ``super().setup()`` first. Calling
        it twice must be harmless.
        """
        for key, value in self.environment_defaults().items():
            os.environ.setdefault(key, value)

    def environment_defaults(self) -> dict[str, str]:
        """Environment variables this backend needs, applied with ``setdefault`` by :meth:`setup`.

        Only settings that are right on every machine with this device (for example
        ``CUDA_DEVICE_MAX_CONNECTIONS=1``); never site-specific ones such as network interfaces,
        InfiniBand HCAs or rendezvous addresses, which the site sets. Default: none.
        """
        return {}

    @property
    def torch_device(self) -> Any:
        """The ``torch.device`` of this process; its ``.type`` is the torch device type that
        tensors, meshes and autocast use (``cuda`` also for a vendor runtime that presents its
        accelerator as CUDA)."""
        raise NotImplementedError

    @property
    def device_type(self) -> str:
        """``torch_device.type``: the string for ``init_device_mesh``, ``torch.autocast`` and the
        like, so callers never write a device type themselves."""
        return self.torch_device.type

    @property
    def default_dtype(self) -> Any:
        """Dtype for parameters and compute by default on this device."""
        import torch

        return torch.float32

    @property
    def supported_dtypes(self) -> tuple:
        """Floating dtypes that tensors and matmuls may use on this device (always including
        ``torch.float32`` and :attr:`default_dtype`); whether each is fast is a separate matter
        (:attr:`fast_bf16`)."""
        import torch

        return (torch.float32, torch.bfloat16, torch.float16)

    @property
    def fast_bf16(self) -> bool:
        """Whether bf16 matmuls are faster than fp32 here (``parallel.mixed_precision=auto``
        then trains in bf16)."""
        return False

    @property
    def fast_fp8(self) -> bool:
        """Whether this device has hardware FP8 matmuls (``torch._scaled_mm``); FP8 training
        (``parallel.fp8_format``) emulates them in high precision where it has not."""
        return False

    def manual_seed(self, seed: int) -> None:
        """Seed host and device generators."""
        import torch

        torch.manual_seed(seed)

    def rng_state(self) -> dict:
        """Device RNG state to checkpoint (host RNG is saved by the trainer).

        A dict of tensors (it is saved with the checkpoint and loaded with ``weights_only=True``);
        ``set_rng_state(rng_state())`` followed by the same random draws on the device gives the
        same numbers. Empty where the device has no generator of its own (CPU).
        """
        return {}

    def set_rng_state(self, state: dict) -> None:
        """Restore what :meth:`rng_state` returned (keys it does not know are ignored)."""

    def synchronize(self) -> None:
        """Wait for queued device work (for timing)."""

    def memory_stats(self) -> dict[str, float]:
        """Memory of this process's device in GiB, as the device reports it (not the host's).

        Keys: ``mem_gib`` (allocated now), ``max_mem_gib`` (peak allocated since start) and
        ``mem_total_gib`` (capacity of the device); a backend leaves out what it cannot know.
        """
        return {}

    def peak_flops(self, dtype: Any) -> float | None:
        """Peak dense matmul FLOP/s of one device for ``dtype``, or None when unknown.

        MFU is ``achieved / peak``; with None the trainer reports no MFU (shown as ``n/a``)
        rather than a made-up one.
        """
        return None

    def peak_flops_note(self, dtype: Any) -> str:
        """Where :meth:`peak_flops` comes from, for the banner (datasheet, derivation, user)."""
        if self.peak_flops(dtype):
            return f"{self.peak_flops(dtype) / 1e12:g} TFLOP/s"
        return "unknown: mfu n/a"

    def megatron_overrides(self) -> dict[str, Any]:
        """megatron-core ``TransformerConfig`` fields this device needs whatever the model asks
        for (for example fusions without a kernel on the device); the megatron engine applies
        them after the model's config is built. Default: none."""
        return {}

    def describe(self) -> str:
        """One line for the banner."""
        return self.name

    def profiler_activities(self) -> list:
        """What ``trainer.profile`` records (``torch.profiler.ProfilerActivity`` values): the
        host's ops; a backend whose kernels torch's profiler sees adds its own."""
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU]

    def autocast(self) -> Any:
        """Context manager for mixed precision (none by default)."""
        return contextlib.nullcontext()
