"""The ``cpu`` backend: gloo process groups, fp32, and megatron-core adapted to run without CUDA."""

from __future__ import annotations

import json
import logging
import os
import platform
import time

from loong_core.devices.base import DeviceBackend

logger = logging.getLogger(__name__)


def _measure_matmul_flops(num_threads: int, size: int = 1024, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


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
        # Advice meant for GPUs, and torch's renaming notices for calls made inside megatron-core.
        warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

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

    def peak_flops(self, dtype) -> float:
        """Measured fp32 matmul FLOP/s of this process's threads, cached per CPU and thread count."""
        import torch

        from loong_core.config.compose import cache_root

        threads = torch.get_num_threads()
        key = f"{platform.processor() or platform.machine()}|{os.cpu_count()}|{threads}|{dtype}"
        path = cache_root() / "cpu_peak_flops.json"
        cache = {}
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        if key not in cache:
            cache[key] = _measure_matmul_flops(threads)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(cache, indent=1))
                os.replace(tmp, path)
            except OSError:
                logger.debug("could not cache CPU peak FLOP/s at %s", path)
        return float(cache[key])

    def describe(self) -> str:
        import torch

        return f"cpu ({torch.get_num_threads()} threads)"
