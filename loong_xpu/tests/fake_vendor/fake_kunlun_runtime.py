"""A CPU stand-in for Kunlun's cuda-compatible runtime (tests only).

``LOONG_XPU_RUNTIME=fake_kunlun_runtime:CPUKunlunRuntime`` makes the xpu backend run on CPU:
tensors on ``cpu``, collectives on gloo, and every ``torch.cuda``-shaped call answered by
:class:`FakeCudaAPI`, which records the calls and reports fixed, fake device memory. Activation
imports the (fake) ``torch_xmlir`` like the real runtime does, then applies the cpu backend's
megatron-core redirects, because this "card" is the CPU.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from loong_xpu.runtime import KunlunRuntime

GIB = 2**30
ALLOCATED, PEAK, TOTAL = 1.5 * GIB, 2.25 * GIB, 96 * GIB


class FakeCudaAPI:
    """The ``torch.cuda`` members the xpu backend calls, answered from CPU."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.current = 0

    def _record(self, *call):
        self.calls.append(call)

    def device_count(self) -> int:
        return int(os.environ.get("FAKE_XPU_COUNT", "8"))

    def set_device(self, index: int) -> None:
        self._record("set_device", index)
        self.current = index

    def current_device(self) -> int:
        return self.current

    def get_device_name(self, index: int | None = None) -> str:
        return "Kunlun P800 (fake, CPU)"

    def get_device_properties(self, index: int | None = None):
        return SimpleNamespace(name=self.get_device_name(index), total_memory=int(TOTAL))

    def synchronize(self, device=None) -> None:
        self._record("synchronize")

    def manual_seed(self, seed: int) -> None:
        self._record("manual_seed", seed)
        torch.manual_seed(seed)

    def get_rng_state(self, device=None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device=None) -> None:
        self._record("set_rng_state")
        torch.set_rng_state(state)

    def memory_allocated(self, device=None) -> int:
        return int(ALLOCATED)

    def max_memory_allocated(self, device=None) -> int:
        return int(PEAK)

    def is_bf16_supported(self) -> bool:
        return True


API = FakeCudaAPI()


class CPUKunlunRuntime(KunlunRuntime):
    """The xpu backend's runtime with the card replaced by the CPU."""

    device_type = "cpu"
    dist_backend = "gloo"

    def activate(self) -> None:
        super().activate()  # imports (fake) torch_xmlir, as on a Kunlun machine
        from loong_core.devices import mcore_cpu

        mcore_cpu.apply()

    @property
    def api(self):
        return API

    def device(self, index: int):
        return torch.device("cpu")  # one host device: no index (DDP and gloo take no device id)
