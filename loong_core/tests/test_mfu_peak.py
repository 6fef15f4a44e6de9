"""MFU a user can trust: the CPU peak is derived from the CPU, unknown GPUs give n/a, never > 100%."""

from __future__ import annotations

import pytest

from loong_core.devices import cpu_peak

CPU = """processor\t: {n}
model name\t: Intel(R) Xeon(R) Platinum 8480C @ 2.00GHz
physical id\t: 0
core id\t: {core}
cpu MHz\t\t: {mhz}
flags\t\t: fpu sse sse2 avx fma avx2 avx512f {extra}
"""


def _cpuinfo(cores: int, threads_per_core: int = 1, mhz: str = "2600.000", extra: str = "") -> str:
    blocks = [CPU.format(n=c * threads_per_core + t, core=c, mhz=mhz, extra=extra)
              for c in range(cores) for t in range(threads_per_core)]
    return "\n".join(blocks)


def test_peak_is_cores_times_clock_times_flops_per_cycle():
    peak = cpu_peak.derive(2, "fp32", _cpuinfo(2), allowed={0, 1})
    assert (peak.cores, peak.ghz, peak.flops_per_cycle, peak.unit) == (2, 2.6, 64, "AVX-512")
    assert peak.flops == pytest.approx(332.8e9)
    assert "2 cores x 2.60 GHz x 64 FLOP/cycle (AVX-512 fp32) = 333 GFLOP/s" in peak.describe("fp32")


def test_hyperthreads_share_a_core_and_threads_cap_the_cores():
    assert cpu_peak.derive(8, "fp32", _cpuinfo(2, threads_per_core=2), allowed={0, 1, 2, 3}).cores == 2
    assert cpu_peak.derive(1, "fp32", _cpuinfo(4), allowed={0, 1, 2, 3}).cores == 1
    assert cpu_peak.derive(4, "fp32", _cpuinfo(4), allowed={2, 3}).cores == 2  # affinity


@pytest.mark.parametrize("flags, dtype, per_cycle", [
    ("amx_bf16 avx512_bf16", "bf16", 1024), ("avx512_bf16", "bf16", 128), ("", "bf16", 64),
    ("amx_bf16", "fp32", 64), ("avx512_fp16", "fp16", 128),
])
def test_flops_per_cycle_follow_the_vector_units(flags, dtype, per_cycle):
    assert cpu_peak.derive(1, dtype, _cpuinfo(1, extra=flags), allowed={0}).flops_per_cycle == per_cycle


def test_avx2_and_sse_machines():
    assert cpu_peak.flops_per_cycle({"avx", "avx2", "fma"}, "fp32") == (32, "AVX2+FMA")
    assert cpu_peak.flops_per_cycle({"sse2"}, "fp32") == (8, "SSE2")


def test_clock_from_the_model_name_when_the_os_gives_no_mhz():
    text = _cpuinfo(1).replace("cpu MHz\t\t: 2600.000\n", "")
    assert cpu_peak.derive(1, "fp32", text, allowed={0}).ghz == 2.0


def test_the_cpu_backend_uses_the_derived_peak_or_the_users():
    import torch

    from loong_core.devices.cpu import CPUBackend

    expected = cpu_peak.derive(torch.get_num_threads(), "bf16")
    assert CPUBackend().peak_flops(torch.bfloat16) == (expected.flops if expected else None)
    assert CPUBackend(peak_tflops=1.5).peak_flops(torch.float32) == 1.5e12
    assert "device.peak_tflops" in CPUBackend(peak_tflops=1.5).peak_flops_note(torch.float32)


def test_a_gpu_missing_from_the_datasheet_table_has_no_peak(monkeypatch):
    import torch

    from loong_core.devices.cuda import CUDABackend

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA Mystery X1")
    backend = CUDABackend()
    assert backend.peak_flops(torch.bfloat16) is None
    assert "not in the datasheet table: mfu n/a" in backend.peak_flops_note(torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA GB200")
    assert backend.peak_flops(torch.bfloat16) == 2500e12
    assert backend.peak_flops(torch.float32) == 1250e12


def test_mfu_is_never_above_100_percent():
    from loong_core.trainer.throughput import Throughput

    meter = Throughput("tokens", flops_per_item=1e9, peak_flops=1e12)
    meter.add(items=2000, seconds=1.0)  # 2e12 FLOP/s against a 1e12 peak
    assert meter.averages()["mfu"] == 1.0
    meter.reset()
    meter.add(items=500, seconds=1.0)
    assert meter.averages()["mfu"] == pytest.approx(0.5)
