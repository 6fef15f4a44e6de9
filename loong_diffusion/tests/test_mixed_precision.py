"""The torch engine's bf16 path on the digits DiT: autocast compute, fp32 weights and Adam state.

Both runs build the same fp32 initial weights from the seed; only the forward/backward runs in
bf16, so each step's loss must stay within one bf16 unit (``2^-8`` relative) of the fp32 run's
(the reasoning of ``loong_llm/tests/test_mixed_precision.py``). Measured: at most 1e-5 relative
(the DiT's zero-initialised output layer keeps the first steps exact).
"""

from __future__ import annotations

from loong_core.testing import assert_within_one_bf16_unit, losses, run_train

STEPS = 5


def test_dit_bf16_stays_within_one_bf16_unit_of_fp32(tmp_path, quiet):
    """Under DDP (autocast) and under FSDP2 (bf16 parameters for compute, fp32 reductions), where
    the DiT's fp32 timestep sinusoids must meet bf16 weights."""
    runs = {}
    for name, overrides in {"fp32": ["parallel.mixed_precision=fp32"],
                            "bf16": ["parallel.mixed_precision=bf16"],
                            "bf16_fsdp": ["parallel.mixed_precision=bf16", "parallel=fsdp"]}.items():
        run_dir = tmp_path / name
        run_train(["experiment=dit_digits_debug", *quiet, f"trainer.train_iters={STEPS}",
                   "trainer.eval_interval=0", "trainer.save_at_end=false", *overrides,
                   f"trainer.run_dir={run_dir}"])
        runs[name] = losses(run_dir)
    assert_within_one_bf16_unit(runs["fp32"], runs["bf16"], STEPS)
    assert_within_one_bf16_unit(runs["fp32"], runs["bf16_fsdp"], STEPS)
