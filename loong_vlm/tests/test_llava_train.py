"""End to end: ``loong train experiment=qwen2_5_vl_debug`` trains a Qwen2.5-VL-style model on the
LLaVA digits demo set (images of mixed sizes, pairs, videos; packed) with the balancer on, and two
data-parallel ranks (each decoding only its own balanced share) follow the one-rank loss curve."""

from __future__ import annotations

import math

import pytest
import yaml

from loong_core.testing import losses, read_metrics, run_train

STEPS = 3
COMMON = ["experiment=qwen2_5_vl_debug", f"trainer.train_iters={STEPS}", "trainer.log_interval=1",
          "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("llava") / "one_rank"
    run_train([*COMMON, f"trainer.run_dir={run_dir}", f"trainer.eval_interval={STEPS}"])
    return run_dir


def test_llava_debug_experiment_trains(one_rank):
    train = read_metrics(one_rank)
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in train) and train[-1]["loss"] < train[0]["loss"]
    assert all(r["balance/max_over_mean_after"] <= r["balance/max_over_mean_before"] for r in train)
    (valid,) = read_metrics(one_rank, "valid")
    assert math.isfinite(valid["loss"])
    saved = yaml.safe_load((one_rank / "config.yaml").read_text())
    assert saved["data"]["name"] == "llava" and saved["model"]["encoder"]["name"] == "qwen2_5_vit"


@pytest.mark.multirank
def test_two_data_parallel_ranks_follow_the_one_rank_curve(tmp_path):
    """Each rank collates (decodes) only its own micro batch, with the balancer (kk_swap) regrouping
    samples of unequal loss-token counts: the engine divides gradients once by the global batch's
    token count, so the grouping does not change them."""
    common = [*COMMON, "trainer.eval_interval=0"]
    run_train([*common, f"trainer.run_dir={tmp_path / 'one'}"])
    run_train([*common, f"trainer.run_dir={tmp_path / 'dp2'}"], nproc=2)
    ref, got = losses(tmp_path / "one"), losses(tmp_path / "dp2")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in ref:
        assert got[step] == pytest.approx(ref[step], abs=2e-5, rel=2e-5), (step, got, ref)
