"""Whole models train the same with the Triton kernels (in Triton's interpreter) as with torch.

llama_debug with every Triton op for 5 steps at TP1 and TP2+SP, and qwen2_5_vl_debug with the
MRoPE rotary kernel, dit_digits' DiT with the adaLN modulation kernel and pi05_debug with the
RMSNorm, SwiGLU and RoPE kernels in its transformers backbone (torch engine) follow the
``kernels=torch`` loss curve within 1e-5 (fp32).
"""

from __future__ import annotations

import logging

import pytest

from loong_core.testing import losses, run_train

pytest.importorskip("loong_kernels")
pytest.importorskip("triton")

QUIET = ["trainer.log_interval=1", "trainer.eval_interval=0", "trainer.progress_bar=false",
         "trainer.tensorboard=false"]
NO_SAVE = ["trainer.save_at_end=false"]
LLAMA_OPS = ["rms_norm", "swiglu", "rope", "cross_entropy", "linear_cross_entropy"]
INTERPRET = {"TRITON_INTERPRET": "1"}
logger = logging.getLogger(__name__)


def _kernels(backend: str, ops: list[str]) -> list[str]:
    return [f"kernels.{op}={backend}" for op in ops]


def _curves(root, name: str, overrides: list[str], ops: list[str], nproc: int = 1):
    """Loss per step with the ops on ``triton`` and on ``torch``."""
    curves = {}
    for backend in ("triton", "torch"):
        run_dir = root / f"{name}_{backend}"
        result = run_train([*overrides, *_kernels(backend, ops), f"trainer.run_dir={run_dir}"], nproc=nproc,
                           env=INTERPRET if backend == "triton" else None)
        assert f"{ops[0]}={backend}" in result.stdout + result.stderr  # the banner's resolved kernels
        curves[backend] = losses(run_dir)
    return curves


def _assert_same_curve(curves, steps: int, tol: float = 1e-5):
    got, want = curves["triton"], curves["torch"]
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    worst = max(abs(got[s] - want[s]) for s in want)
    logger.info("largest triton - torch loss difference over %d steps: %.3g", steps, worst)
    assert worst < tol, (worst, got, want)
    assert abs(want[steps] - want[1]) > 1e-2  # the weights move


# llama_debug's model and data; 2 micro-batches per step instead of 4 (the interpreter is slow).
LLAMA = ["experiment=llama_debug", "trainer.train_iters=5", "trainer.global_batch_size=4", *QUIET]


@pytest.mark.parametrize("layout", ["tp1", pytest.param("tp2_sp", marks=pytest.mark.multirank)])
def test_llama_with_every_triton_kernel_follows_torch(tmp_path, layout):
    parallel = [] if layout == "tp1" else ["parallel=tp2"]  # tp2: TP2 + sequence parallel
    curves = _curves(tmp_path, "llama", [*LLAMA, *parallel], LLAMA_OPS, nproc=1 if layout == "tp1" else 2)
    _assert_same_curve(curves, 5)
    # the seam's modules checkpoint like megatron-core's (SwiGLU has no parameters to save)
    assert (tmp_path / "llama_triton" / "checkpoints" / "iter_0000005" / "loong_complete.json").is_file()


def test_qwen2_5_vl_with_the_mrope_kernel_follows_torch(tmp_path):
    pytest.importorskip("loong_vlm")
    overrides = ["experiment=qwen2_5_vl_debug", "trainer.train_iters=3", *QUIET, *NO_SAVE]
    _assert_same_curve(_curves(tmp_path, "qwen2_5_vl", overrides, ["rope"]), 3)


def test_dit_digits_with_the_modulation_kernel_follows_torch(tmp_path):
    """dit_digits' DiT (torch engine) with every adaLN LayerNorm + modulation on the Triton kernel."""
    pytest.importorskip("loong_diffusion")
    overrides = ["experiment=dit_digits", "trainer.train_iters=3", "trainer.micro_batch_size=8",
                 "trainer.global_batch_size=8", *QUIET, *NO_SAVE]
    _assert_same_curve(_curves(tmp_path, "dit", overrides, ["layer_norm_modulate"]), 3)


def test_pi05_with_the_norm_mlp_and_rope_kernels_follows_torch(tmp_path):
    """pi05_debug (torch engine, a transformers Llama backbone): its RMSNorms, SiLU-gated MLPs
    (backbone and action expert) and rotary embedding on the Triton kernels."""
    pytest.importorskip("loong_embodied")
    pytest.importorskip("transformers")
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "loong_embodied" / "tests" / "data" / "lerobot_metaworld_v3"
    overrides = ["experiment=pi05_debug", f"data.path={data}", "trainer.train_iters=3", *QUIET, *NO_SAVE]
    ops = ["rms_norm", "swiglu", "rope"]
    curves = {}
    for backend in ("triton", "torch"):
        run_dir = tmp_path / f"pi05_{backend}"
        result = run_train([*overrides, *_kernels(backend, ops), f"trainer.run_dir={run_dir}"],
                           env=INTERPRET if backend == "triton" else None)
        log = result.stdout + result.stderr
        if backend == "triton":  # the modules were replaced (plain ops keep transformers' own)
            for what in ("3 RMSNorm modules use rms_norm=triton", "1 gated MLP modules use swiglu=triton",
                         "1 rotary modules use rope=triton"):
                assert what in log, log[-3000:]
        else:
            assert "modules use" not in log
        curves[backend] = losses(run_dir)
    _assert_same_curve(curves, 3)
