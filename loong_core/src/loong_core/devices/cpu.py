"""The ``cpu`` backend: gloo process groups, fp32, and megatron-core adapted to run without CUDA."""

from __future__ import annotations

import functools
import logging
import os

from loong_core.devices.base import DeviceBackend

logger = logging.getLogger(__name__)

# Overrides the CPU's bf16 detection for parallel.mixed_precision=auto (0: fp32, 1: bf16).
BF16_ENV = "LOONG_CPU_BF16"


class CPUBackend(DeviceBackend):
    """CPU training. Every megatron-core redirect lives here (see ``mcore_cpu``)."""

    name = "cpu"
    dist_backend = "gloo"

    @classmethod
    def is_available(cls) -> bool:
        return True

    def setup(self) -> None:
        import torch

        super().setup()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        import warnings

        from loong_core.devices import mcore_cpu

        mcore_cpu.apply()
        unit = self.bf16_unit
        if unit and self.fast_bf16:
            logger.info("cpu: %s bf16 matrix unit: parallel.mixed_precision=auto resolves to bf16 on this CPU "
                        "(%s=0: fp32)", unit, BF16_ENV)
        # Advice meant for GPUs, and torch's renaming notices for calls made inside megatron-core.
        warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

    @functools.cached_property
    def bf16_unit(self) -> str | None:
        """This CPU's bf16 matrix unit (``AMX``, ``AVX512-BF16``) or None (``/proc/cpuinfo`` read once)."""
        from loong_core.devices import cpu_peak

        return cpu_peak.native_bf16_unit()

    @property
    def fast_bf16(self) -> bool:
        """True on a CPU with a bf16 matrix unit (AMX or AVX512-BF16: bf16 matmuls 4.5x, training
        steps 1.4-1.7x faster than fp32, docs/performance.md), unless ``$LOONG_CPU_BF16`` says
        otherwise (``0``: fp32, ``1``: bf16 whatever the CPU)."""
        choice = os.environ.get(BF16_ENV, "").strip().lower()
        if choice in ("0", "false", "no", "off"):
            return False
        if choice in ("1", "true", "yes", "on"):
            return True
        if choice:
            from loong_core.errors import ConfigError

            raise ConfigError(f"{BF16_ENV}={os.environ[BF16_ENV]!r} is not understood: set 0 (fp32), 1 (bf16) or "
                              "unset it (bf16 where the CPU has a bf16 matrix unit)")
        return self.bf16_unit is not None

    @property
    def torch_device(self):
        import torch

        return torch.device("cpu")

    def memory_stats(self) -> dict[str, float]:
        """The host is the device: resident set size now and at its peak, and physical memory."""
        import resource

        stats = {}
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        try:
            import psutil
        except ImportError:
            return {"max_mem_gib": peak_kib / 2**20}
        rss = psutil.Process().memory_info().rss
        stats["mem_gib"] = rss / 2**30
        stats["max_mem_gib"] = max(peak_kib * 1024, rss) / 2**30
        stats["mem_total_gib"] = psutil.virtual_memory().total / 2**30
        return stats

    def _derived_peak(self, dtype):
        import torch

        from loong_core.devices import cpu_peak

        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        return cpu_peak.derive(torch.get_num_threads(), name), name

    def peak_flops(self, dtype) -> float | None:
        """Peak FLOP/s of this process's cores for ``dtype``, derived from the CPU (cores x clock x
        FLOPs per cycle of its vector units, :mod:`loong_core.devices.cpu_peak`); the user's
        ``device.peak_tflops`` when given; None where the OS does not tell (MFU n/a)."""
        if self.peak_tflops:
            return self.peak_tflops * 1e12
        peak, _ = self._derived_peak(dtype)
        return peak.flops if peak else None

    def peak_flops_note(self, dtype) -> str:
        if self.peak_tflops:
            return f"{self.peak_tflops:g} TFLOP/s per process (device.peak_tflops)"
        peak, name = self._derived_peak(dtype)
        return peak.describe(name) if peak else "unknown (no /proc/cpuinfo): mfu n/a"

    def describe(self) -> str:
        import torch

        return f"cpu ({torch.get_num_threads()} threads)"
