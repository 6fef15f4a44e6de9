"""TP2, PP2, DP2 (also with the distributed optimizer and the gradient reduce overlapped with the
backward) and TP2xPP2 follow the single-rank loss curve (same weights, same data)."""

from __future__ import annotations

import pytest

from loong_core.testing import losses, run_train

STEPS = 5
LAYOUTS = {
    "tp2": (2, ["parallel=tp2"]),
    "pp2": (2, ["parallel=pp2"]),
    "dp2": (2, []),
    "dp2_distopt": (2, ["parallel=zero1"]),
    "dp2_distopt_overlap": (2, ["parallel=zero1", "parallel.overlap_grad_reduce=true"]),
    "tp2_pp2": (4, ["parallel=tp2_pp2"]),
    "pp2_vpp2": (2, ["parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"]),
    "recompute_full": (1, ["parallel.recompute_granularity=full", "parallel.recompute_method=uniform",
                           "parallel.recompute_num_layers=1"]),
    "recompute_selective": (1, ["parallel.recompute_granularity=selective"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_curve):
    """Initial weights saved once, and the one-rank loss curve trained from them (the session's
    ``tiny_curve``, shared with the context-parallel tests)."""
    common, ref = tiny_curve
    assert f"trainer.train_iters={STEPS}" in common
    return common, ref, tmp_path_factory.mktemp("parallel")


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_loss_curve_matches_one_rank(reference, layout):
    common, ref, root = reference
    nproc, overrides = LAYOUTS[layout]
    run_dir = root / layout
    run_train([*common, *overrides, f"trainer.run_dir={run_dir}"], nproc=nproc)
    got = losses(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(ref[step], abs=2e-5, rel=2e-5), (layout, step, got, ref)
    # the model actually learns over these steps, so a frozen model could not pass
    assert ref[STEPS] < ref[1]
