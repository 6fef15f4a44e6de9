"""The xpu backend: selection, the error without the vendor stack, routing through the vendor's
cuda-compatible runtime, environment handling, memory and peak FLOP/s, and the device contract.

What these prove without a Kunlun card: loong's side of the routing (which runtime calls the
backend makes, with which device type, dist backend and variables), selection and errors, and
that the backend meets the device contract when the runtime behaves like torch.cuda (here a CPU
stand-in). What they cannot prove: that torch_xmlir's torch.cuda, BKCL and memory counters behave
as torch.cuda does on NVIDIA (docs/xpu.md lists what stays unverified until a P800 run).
"""

from __future__ import annotations

import sys

import pytest
import torch

from loong_core.devices.select import resolve_device_name, select_device
from loong_core.errors import ConfigError
from loong_core.plugins import get_registry
from loong_core.testing import run_train
from loong_core.testing_devices import CONTRACT, check


def test_xpu_is_registered_and_ranked_above_cuda():
    entries = {e.name: e for e in get_registry().entries("device")}
    assert entries["xpu"].distribution == "loong-xpu"
    assert int(entries["xpu"].meta["priority"]) > int(entries["cuda"].meta["priority"])


def test_without_the_vendor_stack_xpu_is_unavailable_and_auto_skips_it(no_vendor):
    from loong_xpu.backend import XPUBackend

    assert XPUBackend.is_available() is False
    assert resolve_device_name("auto") != "xpu"
    with pytest.raises(ConfigError, match=r"device 'xpu' is not available.*install the xpytorch / torch_xmlir"):
        resolve_device_name("xpu")


def test_loong_device_xpu_without_the_vendor_stack_fails_at_once_naming_what_to_install(no_vendor, tmp_path):
    pytest.importorskip("loong_llm", reason="the run uses loong_llm's llama_debug experiment")
    result = run_train(["experiment=llama_debug"], nproc=2, env={"LOONG_DEVICE": "xpu"}, check=False,
                       cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[0].startswith("error: device 'xpu' is not available")
    assert "torch_xmlir" in lines[0] and "LOONG_DEVICE=cpu" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs").exists()  # nothing started, no rank ran


def test_auto_prefers_xpu_when_torch_xmlir_is_importable(fake_vendor):
    assert "torch_xmlir" not in sys.modules
    assert resolve_device_name("auto") == "xpu"
    assert "torch_xmlir" not in sys.modules  # detection does not import (and patch torch)


def test_the_real_runtime_routes_through_torch_cuda_nccl_and_cuda_visible_devices(no_vendor):
    from loong_xpu.backend import XPUBackend
    from loong_xpu.runtime import KunlunRuntime

    runtime = KunlunRuntime()
    assert runtime.api is torch.cuda and runtime.device_type == "cuda" and runtime.dist_backend == "nccl"
    device = XPUBackend(local_rank=3)
    assert isinstance(device.runtime, KunlunRuntime)
    assert device.torch_device == torch.device("cuda", 3) and device.device_type == "cuda"
    assert device.dist_backend == "nccl"
    assert device.visible_devices_var == "CUDA_VISIBLE_DEVICES"
    assert device.environment_defaults() == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_a_bad_runtime_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("LOONG_XPU_RUNTIME", "no_such_module:Runtime")
    from loong_xpu.backend import XPUBackend

    with pytest.raises(ConfigError, match="LOONG_XPU_RUNTIME=no_such_module:Runtime does not name a runtime"):
        XPUBackend()


@pytest.fixture
def fake_xpu(fake_vendor, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("XPU_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LOONG_PEAK_TFLOPS", raising=False)
    return select_device("xpu", local_rank=1)


@pytest.mark.parametrize("item", CONTRACT)
def test_xpu_backend_meets_the_device_contract_over_a_fake_runtime(item, fake_xpu):
    assert check(item, fake_xpu) in ("pass", "n/a")


def test_setup_imports_torch_xmlir_and_binds_the_local_card(fake_xpu, monkeypatch):
    import fake_kunlun_runtime

    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    fake_xpu.setup()
    assert sys.modules["torch_xmlir"].IMPORTED
    assert ("set_device", 1) in fake_kunlun_runtime.API.calls
    assert fake_xpu.dist_backend == "gloo" and fake_xpu.device_type == "cpu"  # the stand-in's
    import os

    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_setup_keeps_the_users_environment(fake_xpu, monkeypatch):
    import os

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    fake_xpu.setup()
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def test_more_ranks_than_visible_cards_is_a_clear_error(fake_xpu, monkeypatch):
    monkeypatch.setenv("FAKE_XPU_COUNT", "1")
    with pytest.raises(ConfigError, match=r"local rank 1 needs card 1 but 1 Kunlun card\(s\) are visible"):
        fake_xpu.setup()


def test_no_visible_card_is_a_clear_error(fake_xpu, monkeypatch):
    monkeypatch.setenv("FAKE_XPU_COUNT", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"torch_xmlir is installed but sees no Kunlun card \(CUDA_VISIBLE_DEVICES=,"):
        fake_xpu.setup()


def test_disagreeing_visible_devices_variables_are_an_error(fake_xpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("XPU_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=0,1 and XPU_VISIBLE_DEVICES=2,3 disagree"):
        fake_xpu.setup()


def test_memory_comes_from_the_device_runtime_not_the_host(fake_xpu):
    fake_xpu.setup()
    assert fake_xpu.memory_stats() == {"mem_gib": 1.5, "max_mem_gib": 2.25, "mem_total_gib": 96.0}


def test_rng_state_round_trips_through_the_runtime(fake_xpu):
    import fake_kunlun_runtime

    fake_xpu.manual_seed(7)
    state = fake_xpu.rng_state()
    assert set(state) == {"xpu"}
    fake_xpu.set_rng_state(state)
    assert ("manual_seed", 7) in fake_kunlun_runtime.API.calls
    assert ("set_rng_state",) in fake_kunlun_runtime.API.calls


def test_peak_flops_is_unknown_unless_the_user_gives_it(fake_xpu, monkeypatch):
    assert fake_xpu.peak_flops(torch.bfloat16) is None
    assert fake_xpu.peak_flops_note(torch.bfloat16) == (
        "no public figure for Kunlun cards: mfu n/a (set device.peak_tflops)")
    monkeypatch.setenv("LOONG_PEAK_TFLOPS", "250")
    assert fake_xpu.peak_flops(torch.bfloat16) == 250e12
    assert fake_xpu.peak_flops_note(torch.bfloat16) == "250 TFLOP/s per card (LOONG_PEAK_TFLOPS)"
    assert fake_xpu.peak_flops(torch.float32) is None  # the one number is the 16-bit peak
    configured = select_device("xpu", peak_tflops=300.0)
    assert configured.peak_flops(torch.float16) == 300e12  # device.peak_tflops wins over the env
    with pytest.raises(ConfigError, match="device.peak_tflops=-1.0 must be a positive number"):
        select_device("xpu", peak_tflops=-1.0).peak_flops(torch.bfloat16)
    monkeypatch.setenv("LOONG_PEAK_TFLOPS", "fast")
    with pytest.raises(ConfigError, match="LOONG_PEAK_TFLOPS='fast' is not a number"):
        fake_xpu.peak_flops(torch.bfloat16)


def test_megatron_runs_without_the_fusions_that_need_apex_or_transformer_engine(fake_xpu):
    overrides = fake_xpu.megatron_overrides()
    assert overrides["gradient_accumulation_fusion"] is False
    assert overrides["masked_softmax_fusion"] is False
    assert set(overrides.values()) == {False}


def test_describe_names_the_card(fake_xpu):
    fake_xpu.setup()
    assert fake_xpu.describe() == "xpu:1 (Kunlun P800 (fake, CPU), cpu runtime of torch_xmlir)"
