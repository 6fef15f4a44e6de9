"""The device contract's conformance suite against core's backends: cpu always, cuda on a GPU."""

from __future__ import annotations

import pytest

from loong_core.devices.select import select_device
from loong_core.testing_devices import CONTRACT, check, conformance


@pytest.fixture(scope="module")
def cpu_device():
    return select_device("cpu")


@pytest.mark.parametrize("item", CONTRACT)
def test_cpu_backend_meets_the_device_contract(item, cpu_device):
    assert check(item, cpu_device) in ("pass", "n/a")


@pytest.mark.parametrize("item", CONTRACT)
def test_cuda_backend_meets_the_device_contract(item):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    assert check(item, select_device("cuda")) in ("pass", "n/a")


def test_the_suite_catches_a_backend_that_breaks_the_contract(cpu_device):
    from loong_core.devices.cpu import CPUBackend

    class Leaky(CPUBackend):
        def environment_defaults(self):
            return {"NCCL_SOCKET_IFNAME": "eth0"}

        def rng_state(self):
            return {"generator": object()}

        def peak_flops(self, dtype):
            return 0

    results = conformance(Leaky())
    assert results["environment_defaults"].startswith("FAIL: NCCL_SOCKET_IFNAME is a site setting")
    assert results["rng_round_trip"].startswith("FAIL")
    assert results["peak_flops"].startswith("FAIL: peak_flops")
    assert results["dtypes"] == "pass"
