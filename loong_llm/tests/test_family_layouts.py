"""The families added after the first five train the same under parallelism as on one rank: the
5-step loss curve of ``experiment=<family>_debug`` at TP2 with sequence parallelism and at
CP2 x EP2 follows the one-rank curve from the same weights (within 2e-5)."""

from __future__ import annotations

import pytest

from loong_core.testing import assert_loss_curve, losses, run_train

STEPS = 5
FAMILIES = ["glm4_moe"]
LAYOUTS = {  # name: (ranks, overrides, what the banner shows)
    "tp2_sp": (2, ["parallel=tp2"], "TP=2 PP=1 VPP=1 CP=1 EP=1 DP=1 SP=True"),
    "cp2_ep2": (2, ["parallel.context_parallel_size=2", "parallel.expert_model_parallel_size=2"],
                "TP=1 PP=1 VPP=1 CP=2 EP=2 DP=1"),
}


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_family_follows_one_rank_curve(family_curve, tmp_path, family, layout):
    common, ref = family_curve(family)
    assert ref[STEPS] < ref[1]  # the model learns over these steps: a frozen one could not pass
    nproc, overrides, banner = LAYOUTS[layout]
    proc = run_train([*common, *overrides, f"trainer.run_dir={tmp_path / layout}"], nproc=nproc)
    assert banner in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    assert_loss_curve(losses(tmp_path / layout), ref, range(1, STEPS + 1), f"{family} {layout}")
