"""The ``cuda`` backend: NVIDIA GPUs with NCCL and bf16."""

from __future__ import annotations

from loong_core.devices.base import DeviceBackend

# Dense peak TFLOP/s (bf16, no sparsity) by device-name fragment; fp32 is taken as TF32 peak / 2.
_PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0,
                     "L40": 181.0, "4090": 165.0, "B200": 2250.0, "GB200": 2500.0}


class CUDABackend(DeviceBackend):
    """One process per GPU; the process's GPU is ``LOCAL_RANK``."""

    name = "cuda"
    pinned_host_memory = True
    side_streams = True
    dist_backend = "nccl"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"

    @classmethod
    def is_available(cls) -> bool:
        import torch

        return torch.cuda.is_available()

    @classmethod
    def unavailable_reason(cls) -> str:
        return ("torch sees no CUDA GPU (torch.cuda.is_available() is false: a CPU-only torch "
                "build, no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides every GPU)")

    def setup(self) -> None:
        import torch

        super().setup()
        torch.cuda.set_device(self.local_rank)

    @property
    def torch_device(self):
        import torch

        return torch.device("cuda", self.local_rank)

    @property
    def default_dtype(self):
        import torch

        return torch.bfloat16

    @property
    def fast_bf16(self) -> bool:
        import torch

        return torch.cuda.is_bf16_supported()

    @property
    def fast_fp8(self) -> bool:
        """FP8 tensor cores: compute capability 8.9 (Ada) or newer (Hopper, Blackwell)."""
        import torch

        return torch.cuda.get_device_capability(self.torch_device) >= (8, 9)

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        torch.cuda.manual_seed(seed)

    def rng_state(self) -> dict:
        import torch

        return {"cuda": torch.cuda.get_rng_state()}

    def set_rng_state(self, state: dict) -> None:
        import torch

        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"])

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def memory_stats(self) -> dict[str, float]:
        import torch

        return {"mem_gib": torch.cuda.memory_allocated() / 2**30,
                "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                "mem_total_gib": torch.cuda.get_device_properties(self.local_rank).total_memory / 2**30}

    def _datasheet(self, dtype):
        """``(FLOP/s, table entry)`` of this GPU from the datasheet table, or ``(None, None)``."""
        import torch

        name = torch.cuda.get_device_name(self.local_rank)
        for fragment in sorted(_PEAK_BF16_TFLOPS, key=len, reverse=True):  # GB200 before B200
            if fragment in name:
                scale = 1.0 if dtype in (torch.bfloat16, torch.float16) else 0.5
                return _PEAK_BF16_TFLOPS[fragment] * 1e12 * scale, fragment
        return None, None

    def peak_flops(self, dtype) -> float | None:
        """Datasheet dense peak of this GPU for ``dtype`` (``device.peak_tflops`` when given);
        None for a GPU the table does not list (MFU n/a rather than a guess)."""
        if self.peak_tflops:
            return self.peak_tflops * 1e12
        return self._datasheet(dtype)[0]

    def peak_flops_note(self, dtype) -> str:
        import torch

        if self.peak_tflops:
            return f"{self.peak_tflops:g} TFLOP/s per GPU (device.peak_tflops)"
        flops, fragment = self._datasheet(dtype)
        if flops is None:
            return (f"{torch.cuda.get_device_name(self.local_rank)} is not in the datasheet table: "
                    f"mfu n/a (set device.peak_tflops)")
        return f"{flops / 1e12:g} TFLOP/s per GPU ({fragment} datasheet, dense, {str(dtype).replace('torch.', '')})"

    def describe(self) -> str:
        import torch

        return f"cuda:{self.local_rank} ({torch.cuda.get_device_name(self.local_rank)})"

    def profiler_activities(self) -> list:
        """The host's ops and the GPU's kernels."""
        from torch.profiler import ProfilerActivity

        return [*super().profiler_activities(), ProfilerActivity.CUDA]
