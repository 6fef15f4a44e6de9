"""Two gloo ranks of llama_debug with the xpu backend over the CPU stand-in runtime train exactly
like the cpu backend (same kernels), with the fake vendor kernels inside the model.

This proves that loong's xpu path (selection, set-up, RNG, process groups, megatron-core
adaptations, memory from the device runtime, the vendor kernels through the spec seam with real
megatron-core shapes) leaves the training mathematics unchanged. It cannot prove anything about
the Kunlun runtime itself (docs/xpu.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loong_core.testing import losses, read_metrics, run_train

FAKE_VENDOR = Path(__file__).parent / "fake_vendor"
FAKE_RUNTIME = "fake_kunlun_runtime:CPUKunlunRuntime"

OVERRIDES = ["experiment=llama_debug", "trainer.train_iters=3", "trainer.log_interval=1",
             "trainer.eval_interval=0", "trainer.save_at_end=false", "parallel.mixed_precision=fp32",
             "kernels.rms_norm=xpu", "kernels.swiglu=xpu", "kernels.rope=xpu"]


@pytest.mark.multirank
def test_two_rank_xpu_run_over_the_fake_runtime_equals_the_cpu_backends_run(tmp_path):
    pytest.importorskip("loong_llm", reason="the run uses loong_llm's llama_debug experiment")
    vendor = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FAKE_VENDOR), os.environ.get("PYTHONPATH")]))}
    runs = {}
    for device, extra in (("cpu", {}), ("xpu", {"LOONG_XPU_RUNTIME": FAKE_RUNTIME})):
        run_dir = tmp_path / device
        result = run_train([*OVERRIDES, f"trainer.run_dir={run_dir}"], nproc=2,
                           env={**vendor, **extra, "LOONG_DEVICE": device}, cwd=tmp_path)
        runs[device] = (run_dir, result.stdout + result.stderr)
    xpu_dir, xpu_log = runs["xpu"]
    assert "device: xpu:0 (Kunlun P800 (fake, CPU), cpu runtime of torch_xmlir) x 2 ranks (gloo)" in xpu_log
    assert "kernels: rms_norm=xpu swiglu=xpu rope=xpu" in xpu_log
    assert ("megatron-core options of device xpu: gradient_accumulation_fusion=False, "
            "masked_softmax_fusion=False") in xpu_log
    cpu_losses, xpu_losses = losses(runs["cpu"][0]), losses(xpu_dir)
    assert len(cpu_losses) == 3 and xpu_losses == cpu_losses
    assert {r["mem_gib"] for r in read_metrics(xpu_dir)} == {1.5}  # the device runtime's memory
    assert all("mfu" not in r for r in read_metrics(xpu_dir))  # no peak given: no MFU
