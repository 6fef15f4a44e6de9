"""Peak FLOP/s of the CPU cores a process uses, derived from the CPU itself (not timed).

``cores x clock x FLOPs per cycle per core``, read from ``/proc/cpuinfo``: the cores are the
physical cores of the CPUs this process may run on (hyper-threads share their core's vector
units), capped by its thread count; the clock is the highest the OS reports (``cpuinfo_max_freq``,
else ``cpu MHz``, else the ``@ x.xxGHz`` of the model name); FLOPs per cycle follow the widest
vector unit the flags announce, with two fused multiply-add pipes per core as on server cores:

| flags | fp32 FLOPs/cycle/core | bf16 |
|---|---|---|
| ``amx_bf16`` (``amx_fp16``) | 64 (AVX-512) | 1024 (AMX tiles) |
| ``avx512_bf16`` (``avx512_fp16``) | 64 | 128 |
| ``avx512f`` | 64 | 64 (no 16-bit unit: computed as fp32) |
| ``avx2`` + ``fma`` | 32 | 32 |
| ``avx`` | 16 | 16 |
| otherwise (SSE2) | 8 | 8 |

A timed matmul is not used: its result depends on what else runs at that moment (a busy
machine made MFU above 100% appear), while this number is an upper bound no run can pass.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
MAX_FREQ = "/sys/devices/system/cpu/cpu{}/cpufreq/cpuinfo_max_freq"


@dataclass(frozen=True)
class CPUPeak:
    """The parts of a derived CPU peak.

    Attributes:
        cores: Physical cores counted.
        ghz: Clock in GHz.
        flops_per_cycle: FLOPs per cycle per core for the dtype.
        unit: The vector unit it assumes (``AVX-512``, ``AMX``...).
    """

    cores: int
    ghz: float
    flops_per_cycle: int
    unit: str

    @property
    def flops(self) -> float:
        """Peak FLOP/s."""
        return self.cores * self.ghz * 1e9 * self.flops_per_cycle

    def describe(self, dtype_name: str) -> str:
        """``2 cores x 2.60 GHz x 64 FLOP/cycle (AVX-512 fp32) = 333 GFLOP/s``."""
        return (f"{self.cores} cores x {self.ghz:.2f} GHz x {self.flops_per_cycle} FLOP/cycle "
                f"({self.unit} {dtype_name}) = {self.flops / 1e9:.0f} GFLOP/s, from /proc/cpuinfo")


def parse_cpuinfo(text: str) -> list[dict[str, str]]:
    """One ``{field: value}`` per logical CPU of ``/proc/cpuinfo``."""
    cpus = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip()] = value.strip()
        if "processor" in fields:
            cpus.append(fields)
    return cpus


def flops_per_cycle(flags: set[str], dtype: str) -> tuple[int, str]:
    """FLOPs per cycle per core and the unit's name for ``dtype`` (``fp32``, ``bf16``, ``fp16``;
    table of the module docstring)."""
    if dtype in ("bf16", "fp16") and f"amx_{dtype}" in flags:
        return 1024, "AMX"
    if dtype in ("bf16", "fp16") and f"avx512_{dtype}" in flags:
        return 128, f"AVX512-{dtype.upper()}"
    if "avx512f" in flags:
        return 64, "AVX-512"
    if "avx2" in flags and "fma" in flags:
        return 32, "AVX2+FMA"
    if "avx" in flags:
        return 16, "AVX"
    return 8, "SSE2"


def _read_cpus(text: str | None) -> list[dict[str, str]] | None:
    """The logical CPUs of ``text`` (``/proc/cpuinfo`` when None; None where it cannot be read)."""
    if text is None:
        try:
            text = CPUINFO.read_text()
        except OSError:
            return None
    return parse_cpuinfo(text)


def native_bf16_unit(text: str | None = None) -> str | None:
    """The CPU's bf16 matrix unit (``AMX`` or ``AVX512-BF16``), None without one (or without
    ``/proc/cpuinfo``): with it, oneDNN runs bf16 matmuls faster than fp32 ones (measured 4.5x on a
    1024 x 512 x 1408 matmul on an AVX512-BF16 EPYC, docs/performance.md); without it bf16 is
    computed through fp32 and is slower (4x on an AVX2 EPYC).

    Args:
        text: ``/proc/cpuinfo`` content (read when None).
    """
    cpus = _read_cpus(text)
    if cpus is None:
        return None
    flags = set(cpus[0].get("flags", "").split()) if cpus else set()
    _, unit = flops_per_cycle(flags, "bf16")
    return unit if unit in ("AMX", "AVX512-BF16") else None


def _clock_ghz(cpus: list[dict[str, str]]) -> float:
    best = 0.0
    for cpu in cpus:
        try:
            best = max(best, int(Path(MAX_FREQ.format(cpu["processor"])).read_text()) / 1e6)
        except (OSError, ValueError):
            pass
    if best:
        return best
    mhz = [float(c["cpu MHz"]) for c in cpus if c.get("cpu MHz", "").replace(".", "", 1).isdigit()]
    if mhz:
        return max(mhz) / 1e3
    for cpu in cpus:
        match = re.search(r"@\s*([\d.]+)\s*GHz", cpu.get("model name", ""))
        if match:
            return float(match.group(1))
    return 0.0


def derive(threads: int, dtype: str = "fp32", text: str | None = None,
           allowed: set[int] | None = None) -> CPUPeak | None:
    """The peak of ``threads`` threads; None where ``/proc/cpuinfo`` does not tell (not Linux).

    Args:
        threads: Threads of this process's matmuls (``torch.get_num_threads()``).
        dtype: ``fp32``, ``bf16`` or ``fp16`` matmuls (AMX / AVX512-BF16 / -FP16 units count).
        text: ``/proc/cpuinfo`` content (read when None).
        allowed: Logical CPUs this process may use (its affinity when None).
    """
    cpus = _read_cpus(text)
    if cpus is None:
        return None
    if allowed is None and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
    if allowed is not None:
        cpus = [c for c in cpus if int(c["processor"]) in allowed] or cpus
    if not cpus:
        return None
    physical = {(c.get("physical id", "0"), c.get("core id", c["processor"])) for c in cpus}
    ghz = _clock_ghz(cpus)
    if not ghz:
        return None
    per_cycle, unit = flops_per_cycle(set(cpus[0].get("flags", "").split()), dtype)
    return CPUPeak(cores=max(1, min(threads, len(physical))), ghz=ghz, flops_per_cycle=per_cycle, unit=unit)
