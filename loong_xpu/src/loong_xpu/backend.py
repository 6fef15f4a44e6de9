"""The ``xpu`` device backend: Baidu Kunlun cards (P800) through the vendor's cuda-compatible runtime.

Everything device-specific goes through :class:`loong_xpu.runtime.KunlunRuntime`: once
``torch_xmlir`` is imported, the card is torch device type ``cuda``, ``torch.cuda.*`` reaches it and
process groups use backend ``nccl`` (BKCL underneath). megatron-core runs there without
TransformerEngine or Apex: :meth:`XPUBackend.megatron_overrides` turns off the fusions that need
their CUDA kernels. ``docs/xpu.md`` lists what is verified only on real hardware.
"""

from __future__ import annotations

import logging
import os

from loong_core.devices.base import DeviceBackend
from loong_core.errors import ConfigError
from loong_xpu.runtime import INSTALL_HINT, load_runtime, vendor_installed

logger = logging.getLogger(__name__)

PEAK_ENV = "LOONG_PEAK_TFLOPS"
XPU_VISIBLE = "XPU_VISIBLE_DEVICES"

# megatron-core fusions backed by Apex / TransformerEngine CUDA kernels, absent on Kunlun.
_MEGATRON_OVERRIDES = {
    "gradient_accumulation_fusion": False,  # Apex fused_weight_gradient_mlp_cuda
    "masked_softmax_fusion": False,  # megatron's scaled_masked_softmax_cuda
    "persist_layer_norm": False,  # Apex persistent LayerNorm
    "memory_efficient_layer_norm": False,  # Apex
    "apply_rope_fusion": False,  # TransformerEngine / Apex fused RoPE (vendor RoPE: kernels.rope=xpu)
}


class XPUBackend(DeviceBackend):
    """One process per Kunlun card; the process's card is ``LOCAL_RANK``.

    Args:
        local_rank: This process's card among the visible ones.
        num_threads: Unused (host threads are the launcher's ``OMP_NUM_THREADS``).
        peak_tflops: The card's peak dense TFLOP/s for 16-bit matmuls, for MFU
            (``device.peak_tflops``; else ``$LOONG_PEAK_TFLOPS``; else unknown and MFU is n/a).
    """

    name = "xpu"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"
    # torch_xmlir presents the card as ``cuda``; whether it carries torch's fused optimizer
    # kernels is not known here, so ``optim.implementation=auto`` keeps torch's default.
    fused_optimizers = False

    def __init__(self, local_rank: int = 0, num_threads: int | None = None,
                 peak_tflops: float | None = None):
        super().__init__(local_rank, num_threads, peak_tflops)
        self.runtime = load_runtime()

    @classmethod
    def is_available(cls) -> bool:
        return vendor_installed()

    @classmethod
    def unavailable_reason(cls) -> str:
        return INSTALL_HINT

    @property
    def dist_backend(self) -> str:  # an instance property: the runtime decides
        return self.runtime.dist_backend

    def environment_defaults(self) -> dict[str, str]:
        # megatron-core orders TP / sequence-parallel communication with compute assuming one
        # hardware queue per device; the vendor's training recipes set the same.
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

    def _visibility(self) -> str:
        names = (self.visible_devices_var, XPU_VISIBLE)
        return ", ".join(f"{name}={os.environ.get(name, '<unset>')}" for name in names)

    def setup(self) -> None:
        super().setup()
        self._user_peak_tflops()  # a bad peak fails now, before anything is built
        cuda_visible, xpu_visible = os.environ.get(self.visible_devices_var), os.environ.get(XPU_VISIBLE)
        if cuda_visible is not None and xpu_visible is not None and cuda_visible != xpu_visible:
            raise ConfigError(
                f"{self.visible_devices_var}={cuda_visible} and {XPU_VISIBLE}={xpu_visible} disagree "
                f"about which Kunlun cards this job uses: set only one of them.")
        self.runtime.activate()
        count = self.runtime.api.device_count()
        if count == 0:
            raise ConfigError(
                f"device=xpu: torch_xmlir is installed but sees no Kunlun card ({self._visibility()}); "
                f"xpu-smi lists the cards and their driver state. Use device=cpu to train without one.")
        if self.local_rank >= count:
            raise ConfigError(
                f"device=xpu: local rank {self.local_rank} needs card {self.local_rank} but {count} "
                f"Kunlun card(s) are visible ({self._visibility()}; xpu-smi lists the cards). Use "
                f"--nproc-per-node {count} or fewer.")
        self.runtime.api.set_device(self.local_rank)

    @property
    def torch_device(self):
        return self.runtime.device(self.local_rank)

    @property
    def default_dtype(self):
        import torch

        return torch.bfloat16

    @property
    def fast_bf16(self) -> bool:
        return True  # the P800's matrix units are built for bf16 training

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.runtime.api.manual_seed(seed)

    def rng_state(self) -> dict:
        return {"xpu": self.runtime.api.get_rng_state()}

    def set_rng_state(self, state: dict) -> None:
        if "xpu" in state:
            self.runtime.api.set_rng_state(state["xpu"])

    def synchronize(self) -> None:
        self.runtime.api.synchronize()

    def memory_stats(self) -> dict[str, float]:
        api, index = self.runtime.api, self.local_rank
        return {"mem_gib": api.memory_allocated(index) / 2**30,
                "max_mem_gib": api.max_memory_allocated(index) / 2**30,
                "mem_total_gib": self.runtime.total_memory(index) / 2**30}

    def _user_peak_tflops(self) -> float | None:
        if self.peak_tflops is not None:
            if not self.peak_tflops > 0:
                raise ConfigError(f"device.peak_tflops={self.peak_tflops} must be a positive number of "
                                  f"TFLOP/s; leave it unset to report no MFU.")
            return float(self.peak_tflops)
        raw = os.environ.get(PEAK_ENV)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{PEAK_ENV}={raw!r} is not a number of TFLOP/s (for example "
                              f"{PEAK_ENV}=300); unset it to report no MFU.") from None
        if not value > 0:
            raise ConfigError(f"{PEAK_ENV}={raw!r} must be a positive number of TFLOP/s.")
        return value

    def peak_flops(self, dtype) -> float | None:
        """The user's peak for 16-bit dtypes (no public source gives the P800's); None for fp32
        and when no peak is given, so MFU shows n/a instead of a guess."""
        import torch

        tflops = self._user_peak_tflops()
        if tflops is None or dtype not in (torch.bfloat16, torch.float16):
            return None
        return tflops * 1e12

    def peak_flops_note(self, dtype) -> str:
        import torch

        if dtype not in (torch.bfloat16, torch.float16):
            return f"unknown for {str(dtype).replace('torch.', '')}: mfu n/a"
        if self.peak_tflops is not None:
            return f"{self.peak_tflops:g} TFLOP/s per card (device.peak_tflops)"
        if os.environ.get(PEAK_ENV):
            return f"{os.environ[PEAK_ENV]} TFLOP/s per card ({PEAK_ENV})"
        return "no public figure for Kunlun cards: mfu n/a (set device.peak_tflops)"

    def megatron_overrides(self) -> dict:
        return dict(_MEGATRON_OVERRIDES)

    def describe(self) -> str:
        name = self.runtime.api.get_device_name(self.local_rank)
        return f"xpu:{self.local_rank} ({name}, {self.runtime.device_type} runtime of torch_xmlir)"
