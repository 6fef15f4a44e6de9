"""Qwen2.5-VL trains the same under tensor parallelism: the loss curve of ``qwen2_5_vl_debug`` (LLaVA
demo data: images of several sizes, videos, packing) at TP2 and TP2+SP equals one rank's."""

from __future__ import annotations

import pytest

from loong_core.testing import losses, run_train

STEPS = 3
COMMON = ["experiment=qwen2_5_vl_debug", f"trainer.train_iters={STEPS}", "trainer.log_interval=1",
          "trainer.eval_interval=0", "trainer.progress_bar=false", "trainer.tensorboard=false",
          "trainer.save_at_end=false"]
LAYOUTS = {"tp2": ["parallel.tensor_model_parallel_size=2"],
           "tp2_sp": ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"]}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen2_5_vl_runs")
    run_train([*COMMON, f"trainer.run_dir={root / 'ref'}"])
    return losses(root / "ref"), root


@pytest.mark.multirank
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tensor_parallel_follows_the_one_rank_curve(one_rank, layout):
    ref, root = one_rank
    run_train([*COMMON, *LAYOUTS[layout], f"trainer.run_dir={root / layout}"], nproc=2)
    got = losses(root / layout)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=2e-5, rel=2e-5), (layout, step, got, ref)
    assert abs(ref[STEPS] - ref[1]) > 1e-3  # the weights move
