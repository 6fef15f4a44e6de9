"""``parallel.mixed_precision=auto`` on CPU: bf16 where the CPU has a bf16 matrix unit, else fp32."""

from __future__ import annotations

import pytest

from loong_core.devices import cpu_peak
from loong_core.devices.cpu import BF16_ENV, CPUBackend
from loong_core.errors import ConfigError

CPU = "processor\t: 0\nmodel name\t: Some CPU @ 2.00GHz\ncpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx avx2 fma {}\n"


@pytest.mark.parametrize("flags, unit", [
    ("avx512f avx512_bf16 amx_tile amx_bf16", "AMX"), ("avx512f avx512_bf16", "AVX512-BF16"),
    ("avx512f", None), ("", None),
])
def test_only_a_bf16_matrix_unit_counts(flags, unit):
    assert cpu_peak.native_bf16_unit(CPU.format(flags)) == unit


def test_no_cpuinfo_means_no_unit():
    assert cpu_peak.native_bf16_unit("") is None


@pytest.mark.parametrize("unit, env, fast", [
    ("AVX512-BF16", None, True), ("AMX", None, True), (None, None, False),
    ("AVX512-BF16", "0", False), (None, "1", True), ("AMX", "off", False),
])
def test_fast_bf16_follows_the_cpu_unless_the_environment_says(monkeypatch, unit, env, fast):
    monkeypatch.setattr(cpu_peak, "native_bf16_unit", lambda text=None: unit)
    if env is None:
        monkeypatch.delenv(BF16_ENV, raising=False)
    else:
        monkeypatch.setenv(BF16_ENV, env)
    assert CPUBackend().fast_bf16 is fast


def test_auto_resolves_to_what_fast_bf16_says_on_both_engines(monkeypatch):
    import torch

    from loong_core.config.schema import ParallelConfig
    from loong_core.engines.megatron.precision import resolve
    from loong_core.engines.torch_native.parallelize import compute_dtype

    for env, dtype, name in (("1", torch.bfloat16, "bf16"), ("0", torch.float32, "fp32")):
        monkeypatch.setenv(BF16_ENV, env)
        assert compute_dtype(ParallelConfig(mixed_precision="auto"), CPUBackend()) == dtype
        assert resolve("auto", CPUBackend()) == name
        assert compute_dtype(ParallelConfig(mixed_precision="fp32"), CPUBackend()) == torch.float32


def test_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(BF16_ENV, "maybe")
    with pytest.raises(ConfigError, match="LOONG_CPU_BF16='maybe'"):
        assert CPUBackend().fast_bf16 is None  # never reached: reading it raises


def test_a_run_on_auto_trains_in_bf16_when_the_cpu_is_fast_at_it(tmp_path):
    from loong_core.testing import read_metrics, run_train

    out = run_train(["experiment=llama_debug", "trainer.train_iters=3", "trainer.log_interval=1",
                     "trainer.eval_interval=0", "trainer.eval_at_start=false", "trainer.save_at_end=false",
                     "trainer.progress_bar=false", "trainer.tensorboard=false", f"trainer.run_dir={tmp_path}"],
                    env={BF16_ENV: "1"}, timeout=300)
    assert "precision: bf16 (params bf16 + fp32 main params" in out.stdout + out.stderr
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses)
